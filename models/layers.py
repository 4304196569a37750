"""Building blocks shared by teacher and student (packed (T, d) activations, no padding)."""
from __future__ import annotations



import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import BackboneConfig, FeatureConfig, RoPEConfig
from .data import ID_FIELDS, field_vocab, n_cross_features
from .kernels import interval_attention


class TokenEmbedding(nn.Module):
    """Sum of one embedding per feature column, all fields in one table (row 0 of a field = null).
    id_dropout: in training, the probability that a token's memorising ids (ID_FIELDS) read as null."""

    def __init__(self, fc: FeatureConfig, d: int, id_dropout: float = 0.0):
        super().__init__()
        self.id_dropout = id_dropout
        vocab = field_vocab(fc)
        self.register_buffer("offsets", torch.tensor([0] + list(torch.tensor(vocab).cumsum(0)[:-1]), dtype=torch.long), persistent=False)
        self.table = nn.Embedding(int(sum(vocab)), d)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if self.training and self.id_dropout > 0:
            dropped = torch.rand(feats.shape[0], 1, device=feats.device) < self.id_dropout
            is_id = torch.zeros(feats.shape[1], dtype=torch.bool, device=feats.device)
            is_id[list(ID_FIELDS)] = True
            feats = feats.masked_fill(dropped & is_id, 0)
        return self.table(feats + self.offsets).sum(1)


class CrossFeatures(nn.Module):
    """The scored tokens' cross features (data.cross_counts, MTGR) into the residual stream: a small MLP
    whose output layer starts at zero (LazFormer's zero-initialised adapter for ranking-only features),
    so at initialisation the model is the sequence model alone. None when the features are off."""

    def __init__(self, n_in: int, d: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, d), nn.SiLU(), nn.Linear(d, d))

    @staticmethod
    def maybe(fc: FeatureConfig, d: int) -> "CrossFeatures | None":
        n = n_cross_features(fc)
        return CrossFeatures(n, d) if n else None

    def reset_adapter(self) -> None:
        nn.init.zeros_(self.net[-1].weight)

    def forward(self, cross):
        return self.net(cross)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class RoPE(nn.Module):
    """Rotary embedding on timestamps (CADET) or token indices (ablation).

    time:  angle_i(t) = t * phi_min / dt_max * base^(2i/d), t in seconds. Attention depends only on
           time differences, so t is taken relative to the sequence's newest token (exactly
           equivalent, and keeps fp32 angles precise; computed in float64)."""

    def __init__(self, cfg: RoPEConfig, head_dim: int):
        super().__init__()
        self.cfg = cfg
        half = head_dim // 2
        i = torch.arange(half, dtype=torch.float64)
        if cfg.mode == "time":
            freq = cfg.phi_min / cfg.dt_max_s * cfg.base ** (2 * i / head_dim)
        else:
            freq = cfg.index_base ** (-2 * i / head_dim)
        self.register_buffer("freq", freq, persistent=False)

    def angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """pos: float64 (T,) seconds (time) or indices (index)."""
        if self.cfg.mode == "none":
            return None
        ang = pos.double()[:, None] * self.freq[None, :]
        return torch.cos(ang).float(), torch.sin(ang).float()

    @staticmethod
    def apply(x: torch.Tensor, cs) -> torch.Tensor:
        if cs is None:
            return x
        cos, sin = cs[0][:, None, :], cs[1][:, None, :]  # (T, 1, half)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
        return out.flatten(-2).to(x.dtype)


def rope_positions(cfg: RoPEConfig, ts_ms: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Per-token RoPE position: seconds relative to the sequence's newest token, or index within it."""
    from .masks import seq_index
    seq = seq_index(offsets)
    if cfg.mode == "index":
        return (torch.arange(seq.numel(), device=ts_ms.device) - offsets[seq]).double()
    ref = torch.zeros(offsets.numel() - 1, dtype=torch.long, device=ts_ms.device).scatter_reduce(
        0, seq, ts_ms, "amax", include_self=False)
    return (ts_ms - ref[seq]).double() / 1000.0


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        d, h = cfg.d_model, cfg.n_heads
        assert d % h == 0
        self.h, self.dh = h, d // h
        self.cfg = cfg
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.q_gate = nn.Linear(d, d) if cfg.qk_gate else None
        self.k_gate = nn.Linear(d, d) if cfg.qk_gate else None
        self.q_norm = RMSNorm(self.dh) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.dh) if cfg.qk_norm else None

    def forward(self, h, lo, hi, rope_cs, n_keys: int | None = None, queries_from: int = 0):
        """n_keys: the export path (see kernels.prefix_interval_attention); None = the configured backend.
        queries_from (export path only): only the rows from this one on are queried and returned, lo/hi are theirs."""
        T = h.shape[0]
        q, k, v = self.qkv(h).view(T, 3, self.h, self.dh).unbind(1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.q_gate is not None:  # CADET Q/K gates: bound the logits, against attention sinks
            q = q * torch.sigmoid(self.q_gate(h)).view(T, self.h, self.dh)
            k = k * torch.sigmoid(self.k_gate(h)).view(T, self.h, self.dh)
        q, k = RoPE.apply(q, rope_cs), RoPE.apply(k, rope_cs)
        q, k = q[queries_from:].to(v.dtype), k.to(v.dtype)  # under autocast v is bf16 while norms/RoPE give fp32
        backend = self.cfg.attn_backend if n_keys is None else "prefix"
        o = interval_attention(q, k, v, lo, hi, backend=backend, chunk=self.cfg.attn_chunk, n_keys=n_keys)
        return self.proj(o.reshape(q.shape[0], -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int, ratio: float):
        super().__init__()
        hdim = int(d * ratio)
        self.w12 = nn.Linear(d, 2 * hdim, bias=False)
        self.w3 = nn.Linear(hdim, d, bias=False)

    def forward(self, x):
        a, b = self.w12(x).chunk(2, -1)
        return self.w3(F.silu(a) * b)


class Block(nn.Module):
    """Pre-norm residual block: x + Attn(gate(norm(x))), x + MLP(norm(x))."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model)
        self.in_gate = nn.Linear(cfg.d_model, cfg.d_model) if cfg.input_gate else None
        self.attn = Attention(cfg)
        self.norm2 = RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_ratio)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, lo, hi, rope_cs, n_keys: int | None = None, queries_from: int = 0):
        """queries_from (export path, with n_keys): the rows before it are keys only, the block returns the rest."""
        h = self.norm1(x)
        if self.in_gate is not None:  # CADET input self-gate
            h = h * torch.sigmoid(self.in_gate(h))
        x = x[queries_from:] + self.drop(self.attn(h, lo, hi, rope_cs, n_keys, queries_from))
        return x + self.drop(self.mlp(self.norm2(x)))


class BucketHeads(nn.Module):
    """K position-bucket heads (CADET): logit of a click if the ad lands in bucket k.

    ``calibration`` is a per-bucket logit shift fitted on held-out data after training
    (models.train.calibrate); it is part of the weights, so the ONNX graph and every prediction carry it.
    Training runs with it at zero (fit resets it), so the shift never feeds back into the weights."""

    def __init__(self, d: int, K: int):
        super().__init__()
        self.net = nn.Sequential(RMSNorm(d), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, K))
        self.register_buffer("calibration", torch.zeros(K))
        self.set_prior(torch.full((K,), 0.5))

    def set_prior(self, ctr: torch.Tensor) -> None:
        """Start every head at its bucket's base rate (models.train.fit passes the training window's observed
        CTR per bucket). From 0.5, a head's descent speed is set by its traffic, so early in training the
        busier (higher-CTR) bucket's head predicts *lower* and the ranking inverts."""
        c = ctr.to(self.net[-1].bias).clamp(1e-4, 1 - 1e-4)
        with torch.no_grad():
            self.net[-1].bias.copy_(torch.log(c / (1 - c)))

    def forward(self, h):
        return self.net(h) + self.calibration.to(h.dtype)


class AuxHeads(nn.Module):
    """Training-only auxiliary heads (CADET): click type (classes) and log dwell (regression)."""

    def __init__(self, d: int, n_click_types: int):
        super().__init__()
        self.norm = RMSNorm(d)
        self.click_type = nn.Linear(d, n_click_types)
        self.dwell = nn.Linear(d, 1)

    def forward(self, h):
        h = self.norm(h)
        return self.click_type(h), self.dwell(h).squeeze(-1)


def gather_bucket(logits: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, bucket.long().clamp(0, logits.shape[1] - 1)[:, None]).squeeze(1)


def ctr_loss_sum(logits, bucket, label):
    """CADET loss: BCE only on the head of the impression's real bucket (summed)."""
    return F.binary_cross_entropy_with_logits(gather_bucket(logits, bucket).float(), label, reduction="sum")


def label_loss_sums(out: dict, tg: dict, backbone) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """The losses on the day's labels, name -> (sum, count, weight): CADET's per-bucket CTR loss and, when the
    forward pass trained the auxiliary heads, the click-type CE over clicked targets and the dwell MSE over
    targets with a dwell (weights from ``backbone``). The trainer normalises by global counts."""
    n = torch.tensor(float(tg["label"].numel()), device=tg["label"].device)
    res = {"ctr": (ctr_loss_sum(out["logits"], tg["bucket"], tg["label"]), n, 1.0)}
    if "click_type" in out:
        clicked = tg["label"] > 0.5
        ct_logits, dwell_pred = out["click_type"].float(), out["dwell"].float()
        ct = F.cross_entropy(ct_logits[clicked], tg["click_type"][clicked].long(), reduction="sum") if clicked.any() \
            else ct_logits.sum() * 0.0
        m = ~torch.isnan(tg["log_dwell"])
        dw = ((dwell_pred[m] - tg["log_dwell"][m]) ** 2).sum() if m.any() else dwell_pred.sum() * 0.0
        res["click_type"] = (ct, clicked.sum().float(), backbone.aux_click_type_weight)
        res["dwell"] = (dw, m.sum().float(), backbone.aux_dwell_weight)
    return res


def init_weights(module: nn.Module):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, BucketHeads):
            m.set_prior(torch.full_like(m.calibration, 0.5))
        elif isinstance(m, CrossFeatures):
            m.reset_adapter()
