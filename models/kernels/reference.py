"""Torch reference of interval attention: the specification of the kernels.

Contract (DESIGN.md, "One attention contract for every mask"). Tokens of several
sequences are packed along one axis of length T (no padding). Query q attends to
the keys j with lo[q] <= j < hi[q], plus itself (j == q), with softmax weights.
lo/hi are *global* packed indices, so packing is expressed by the bounds alone.

`interval_attention_reference` is exact (fp32 softmax and accumulation by default)
and memory-aware: queries are processed in chunks, each chunk only touches the key
range [min lo, max hi) it needs, and the backward pass recomputes the chunk's
probabilities from the saved log-sum-exp (flash-attention style), so memory is
O(chunk x key range) rather than O(T^2) in both passes.

Shapes: q, k, v (T, H, D); lo, hi (T,) integer; returns (T, H, D) in q's dtype.
"""
from __future__ import annotations

import math

import torch


def _chunks(T: int, chunk: int):
    for c0 in range(0, T, chunk):
        yield c0, min(T, c0 + chunk)


def _chunk_scores(qh, kh, lo, hi, c0, c1, scale, cdt):
    """Scores of queries [c0, c1) against their key range (masked entries -inf), in place friendly.
    qh, kh: (H, T, D) in the compute dtype. Returns (S (H, C, Lk) fp32 or None, s_self (H, C), klo, khi)."""
    qc = qh[:, c0:c1]
    s_self = (qc * kh[:, c0:c1]).sum(-1).float() * scale  # (H, C)
    lo_c, hi_c = lo[c0:c1], hi[c0:c1]
    nonempty = hi_c > lo_c
    if not bool(nonempty.any()):
        return None, s_self, 0, 0
    klo = int(lo_c[nonempty].min())
    khi = int(hi_c[nonempty].max())
    S = torch.matmul(qc, kh[:, klo:khi].transpose(1, 2)).float().mul_(scale)  # (H, C, Lk)
    j = torch.arange(klo, khi, device=qh.device)
    qi = torch.arange(c0, c1, device=qh.device)
    invalid = (j[None, :] < lo_c[:, None]) | (j[None, :] >= hi_c[:, None]) | (j[None, :] == qi[:, None])
    S.masked_fill_(invalid[None], float("-inf"))
    return S, s_self, klo, khi


def _heads_first(x, dt):
    return x.transpose(0, 1).to(dt).contiguous()  # (H, T, D)


class _IntervalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lo, hi, scale, chunk, cdt):
        T, H, _ = q.shape
        qh, kh, vh = _heads_first(q, cdt), _heads_first(k, cdt), _heads_first(v, cdt)
        out = torch.empty(H, T, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.empty(H, T, dtype=torch.float32, device=q.device)
        for c0, c1 in _chunks(T, chunk):
            S, s_self, klo, khi = _chunk_scores(qh, kh, lo, hi, c0, c1, scale, cdt)
            vself = vh[:, c0:c1].float()
            if S is None:
                out[:, c0:c1] = vself
                lse[:, c0:c1] = s_self
                continue
            m = torch.maximum(S.amax(-1), s_self)  # (H, C), finite thanks to the self term
            P = S.sub_(m[..., None]).exp_()
            p_self = torch.exp(s_self - m)
            l = P.sum(-1) + p_self
            o = torch.matmul(P.to(cdt), vh[:, klo:khi]).float()
            o.add_(p_self[..., None] * vself).div_(l[..., None])
            out[:, c0:c1] = o
            lse[:, c0:c1] = m + torch.log(l)
        out = out.transpose(0, 1).contiguous()
        ctx.save_for_backward(q, k, v, lo, hi, out, lse)
        ctx.scale, ctx.chunk, ctx.cdt = scale, chunk, cdt
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lo, hi, out, lse = ctx.saved_tensors
        scale, chunk, cdt = ctx.scale, ctx.chunk, ctx.cdt
        T = q.shape[0]
        qh, kh, vh = _heads_first(q, cdt), _heads_first(k, cdt), _heads_first(v, cdt)
        doh = _heads_first(dout, torch.float32)  # (H, T, D)
        delta = (doh * out.transpose(0, 1)).sum(-1)  # (H, T)
        dq = torch.zeros(qh.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(kh.shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(vh.shape, dtype=torch.float32, device=q.device)
        for c0, c1 in _chunks(T, chunk):
            S, s_self, klo, khi = _chunk_scores(qh, kh, lo, hi, c0, c1, scale, cdt)
            do_c = doh[:, c0:c1]  # (H, C, D)
            lse_c, dl_c = lse[:, c0:c1], delta[:, c0:c1]
            qc, kself, vself = qh[:, c0:c1].float(), kh[:, c0:c1].float(), vh[:, c0:c1].float()
            p_self = torch.exp(s_self - lse_c)  # (H, C)
            ds_self = p_self * ((do_c * vself).sum(-1) - dl_c)
            dv[:, c0:c1] += p_self[..., None] * do_c
            dq[:, c0:c1] += ds_self[..., None] * kself * scale
            dk[:, c0:c1] += ds_self[..., None] * qc * scale
            if S is None:
                continue
            P = S.sub_(lse_c[..., None]).exp_()  # (H, C, Lk); masked entries are exp(-inf) = 0
            # matmul inputs in the compute dtype (a no-op in fp32), accumulation in fp32
            kc, vc, do_x = kh[:, klo:khi], vh[:, klo:khi], do_c.to(cdt)
            dv[:, klo:khi] += torch.matmul(P.transpose(1, 2).to(cdt), do_x).float()
            dS = torch.matmul(do_x, vc.transpose(1, 2)).float().sub_(dl_c[..., None]).mul_(P)
            dq[:, c0:c1] += torch.matmul(dS.to(cdt), kc).float().mul_(scale)
            dk[:, klo:khi] += torch.matmul(dS.transpose(1, 2).to(cdt), qh[:, c0:c1]).float().mul_(scale)
        tr = lambda x, like: x.transpose(0, 1).to(like.dtype)  # noqa: E731
        return tr(dq, q), tr(dk, k), tr(dv, v), None, None, None, None, None


def interval_attention_reference(q, k, v, lo, hi, scale: float | None = None, chunk: int = 256,
                                 compute_dtype: torch.dtype | None = torch.float32):
    """Exact chunked interval attention. compute_dtype=None computes the matmuls in q's dtype
    (the "bf16 torch reference" of the tolerance idiom); softmax statistics stay fp32."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    cdt = q.dtype if compute_dtype is None else compute_dtype
    lo = lo.to(device=q.device, dtype=torch.long)
    hi = hi.to(device=q.device, dtype=torch.long)
    return _IntervalAttention.apply(q, k, v, lo, hi, float(scale), int(chunk), cdt)


def dense_mask(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """(T, T) boolean mask of the contract: allowed[q, j] = lo_q <= j < hi_q or j == q."""
    T = lo.shape[0]
    j = torch.arange(T, device=lo.device)
    m = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
    m |= torch.eye(T, dtype=torch.bool, device=lo.device)
    return m


def naive_interval_attention(q, k, v, lo, hi, scale: float | None = None):
    """Dense-mask softmax attention, O(T^2) memory: the test oracle (and the benchmark's SDPA path)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    mask = dense_mask(lo.long(), hi.long())
    S = torch.einsum("qhd,khd->hqk", q, k) * scale
    S = S.masked_fill(~mask[None], float("-inf"))
    P = torch.softmax(S, dim=-1)
    return torch.einsum("hqk,khd->qhd", P, v)


def sdpa_interval_attention(q, k, v, lo, hi, scale: float | None = None):
    """torch SDPA with the dense boolean mask (the baseline of benchmarks)."""
    mask = dense_mask(lo.long(), hi.long())
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask[None, None], scale=scale)
    return out[0].transpose(0, 1)


def prefix_interval_attention(q, k, v, lo, hi, scale: float | None = None, n_keys: int | None = None):
    """The contract when no query looks past the first ``n_keys`` tokens (every hi_q <= n_keys; None = T):
    the serving layout [history | candidates], where candidates see only history. Scores are taken
    against those keys plus each query's own key, O(T x n_keys), with no data-dependent Python, so the
    function traces into a static ONNX graph (the export path). Empty key prefixes (a user without
    history) are fine: the self key is always there. ``q`` (with lo, hi) may hold only the last rows
    of the T tokens of k and v: the export's last layer queries the candidates alone. ``lo=None``: every
    interval starts at the first key (the serving layout's), one comparison less in the graph."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    T, first = k.shape[0], k.shape[0] - q.shape[0]
    n = T if n_keys is None else n_keys
    kp, vp = k[:n], v[:n]
    k_self, v_self = k[first:], v[first:]
    j = torch.arange(n, device=q.device)
    qi = torch.arange(first, T, device=q.device)
    allowed = (j[None, :] < hi[:, None]) & (j[None, :] != qi[:, None])
    if lo is not None:
        allowed &= j[None, :] >= lo[:, None]
    # The mask as an additive bias, made once and added to every head's scores (onnxruntime's Where
    # broadcasting the mask over the heads took longer than the score MatMul itself).
    bias = torch.where(allowed, 0.0, float("-inf")).to(q.dtype)
    qh, kh, vh = q.transpose(0, 1), kp.transpose(0, 1), vp.transpose(0, 1)  # (H, ., D): batched MatMuls
    S = torch.matmul(qh, kh.transpose(1, 2)) * scale + bias[None]
    s_self = (q * k_self).sum(-1).transpose(0, 1)[..., None] * scale  # (H, Tq, 1)
    P = torch.softmax(torch.cat([S, s_self], -1), dim=-1)
    o = torch.matmul(P[..., :n], vh).transpose(0, 1) + P[..., n].transpose(0, 1)[..., None] * v_self
    return o
