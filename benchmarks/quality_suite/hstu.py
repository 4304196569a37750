"""An HSTU-style ranker beside the CADET-style teacher (issue #34 item 4; HSTU: Zhai et al., ICML 2024, seed 002).

Everything but the layer is the teacher's: its interleaved tokens, embeddings, cross features, position-bucket
heads, auxiliary heads, masks (the delay mask on the scored tokens), data and size (d, heads, layers, context).
The layer is HSTU's, pointwise aggregated attention with a relative time bias in place of the gated softmax block:

    U, V, Q, K = split(SiLU(f1(norm(x))))
    A[q, j]    = SiLU(Q_q . K_j + rab[bucket(t_q - t_j)]) / n      for j in q's interval and j = q, else 0
    x         <- x + f2(norm(A V) * U)

with n the context length (HSTU divides by the sequence length instead of normalising each row, which keeps how
much a user engaged), bucket(dt) = floor(ln(max(dt, 1 s)) / 0.301) as in HSTU's released code, and rab a learnt
bias per head and bucket. No RoPE, no QK-norm, no gates: those are CADET's. CADET's table reports 0.8554 AUC for
itself against 0.8505 for HSTU on its data; the report prints ours paired by seed.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from models.config import TeacherConfig
from models.layers import RMSNorm, init_weights
from models.teacher import Teacher

LOG_BUCKET_WIDTH = 0.301   # HSTU's released code: ln(dt) / 0.301 buckets


def time_buckets(dt_ms: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """HSTU's bucket of a time difference: ln of the seconds (at least 1 s) in steps of 0.301, clipped."""
    seconds = dt_ms.abs().double().div(1000.0).clamp(min=1.0)
    return (seconds.log() / LOG_BUCKET_WIDTH).long().clamp(0, n_buckets - 1)


def _attend_chunk(q, k, v, ts, lo, hi, rab, c0: int, klo: int, n: float):
    """Queries c0.. (q, lo, hi are theirs) against keys klo.. (k, v, ts are theirs, ts holding the queries' times
    too): the pointwise SiLU attention of the module doc. q (C, H, D), k and v (L, H, D) -> (C, H, D)."""
    C, L = q.shape[0], k.shape[0]
    j = torch.arange(klo, klo + L, device=q.device)
    qi = torch.arange(c0, c0 + C, device=q.device)
    attends = ((j[None] >= lo[:, None]) & (j[None] < hi[:, None])) | (j[None] == qi[:, None])   # (C, L)
    tq = ts[c0 - klo:c0 - klo + C]
    bias = rab[time_buckets(tq[:, None] - ts[None, :], rab.shape[0])]                        # (C, L, H)
    scores = torch.einsum("chd,lhd->hcl", q, k) + bias.permute(2, 0, 1)
    weights = F.silu(scores) * attends[None].to(scores.dtype) / n
    return torch.einsum("hcl,lhd->chd", weights, v)


def hstu_interval_attention(q, k, v, lo, hi, ts, rab, n: float, chunk: int = 128):
    """Pointwise attention under the project's interval contract (models/kernels/reference.py: query q reads keys
    lo[q] <= j < hi[q] and itself, packed sequences expressed by the bounds alone). Queries go in chunks that each
    touch only the key range they need; each chunk is recomputed in the backward pass (activation checkpointing),
    so memory stays O(chunk x key range). q, k, v (T, H, D); lo, hi (T,); ts (T,) ms; rab (buckets, H)."""
    T = q.shape[0]
    out = []
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        lo_c, hi_c = lo[c0:c1], hi[c0:c1]
        klo = min(c0, int(lo_c.min()))
        khi = max(c1, int(hi_c.max()))
        args = (q[c0:c1], k[klo:khi], v[klo:khi], ts[klo:khi], lo_c, hi_c, rab, c0, klo, n)
        out.append(checkpoint(_attend_chunk, *args, use_reentrant=False) if torch.is_grad_enabled()
                   else _attend_chunk(*args))
    return torch.cat(out)


class HSTULayer(nn.Module):
    def __init__(self, d: int, n_heads: int, n_buckets: int, context: int):
        super().__init__()
        self.h, self.dh, self.n = n_heads, d // n_heads, float(context)
        self.norm = RMSNorm(d)
        self.f1 = nn.Linear(d, 4 * d)
        self.rab = nn.Parameter(torch.zeros(n_buckets, n_heads))
        self.attn_norm = RMSNorm(d)
        self.f2 = nn.Linear(d, d)

    def forward(self, x, lo, hi, ts):
        T = x.shape[0]
        u, v, q, k = F.silu(self.f1(self.norm(x))).chunk(4, -1)
        heads = lambda z: z.reshape(T, self.h, self.dh)  # noqa: E731
        o = hstu_interval_attention(heads(q), heads(k), heads(v), lo, hi, ts, self.rab, self.n)
        return x + self.f2(self.attn_norm(o.reshape(T, -1)) * u)


@dataclasses.dataclass
class HSTUConfig(TeacherConfig):
    """The teacher's configuration, with HSTU's layer. ``time_buckets``: HSTU's 0.301-wide log buckets reach
    e^(63 x 0.301) s, some 5,000 years, with 64 of them."""
    time_buckets: int = 64

    @classmethod
    def like(cls, teacher: TeacherConfig) -> "HSTUConfig":
        return cls(**{f.name: getattr(teacher, f.name) for f in dataclasses.fields(teacher)})

    def build(self) -> "HSTURanker":
        return HSTURanker(self)


class HSTURanker(Teacher):
    """The teacher with HSTU's layers (Teacher.contextualise): the same inputs, heads and losses."""

    def __init__(self, cfg: HSTUConfig):
        super().__init__(cfg)
        b = cfg.backbone
        self.blocks = nn.ModuleList([HSTULayer(b.d_model, b.n_heads, cfg.time_buckets, cfg.max_len)
                                     for _ in range(b.n_layers)])
        init_weights(self)

    def contextualise(self, x, lo, hi, t):
        for layer in self.blocks:
            x = layer(x, lo, hi, t["ts"])
        return x

