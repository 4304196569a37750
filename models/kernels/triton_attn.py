"""Triton interval attention (forward + backward) with block skipping.

Same contract and layout as reference.py: packed q, k, v of shape (T, H, D), per-query
bounds lo/hi (global indices); query q sees keys in [lo_q, hi_q) plus itself.

Speed comes from skipping fully masked tiles: a query block only loops over the key
blocks covering [min lo, max hi) of its rows (causal: L^2/2; candidates: L*N; sliding
window: L*W). The self term is handled per row (forward: it seeds the online softmax,
so every row has a finite max; backward: added elementwise in torch), so candidate
blocks never visit the other candidates' keys.

Backward: dQ kernel loops over key blocks like the forward; dK/dV kernel loops, per
key block, over the query blocks whose key range overlaps it (range precomputed in
torch, non-overlapping blocks skipped with a scalar test).

Plain pointer arithmetic only (tl.make_block_ptr is removed in Triton 3.9), so the
kernels also run under TRITON_INTERPRET=1 on CPU. This module must be imported after
TRITON_INTERPRET is set (triton decides at decoration time).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from contracts import settings

INTERPRET = settings.triton_interpret()


@triton.jit
def _query_rows(LO, HI, qb, T, BM: tl.constexpr):
    """Query block ``qb``: its rows, which of them exist, and each row's key interval [lo, hi)."""
    offs_m = qb * BM + tl.arange(0, BM)
    row_ok = offs_m < T
    lo = tl.load(LO + offs_m, mask=row_ok, other=0)
    hi = tl.load(HI + offs_m, mask=row_ok, other=0)
    return offs_m, row_ok, lo, hi


@triton.jit
def _attends(offs_m, offs_n, lo, hi):
    """Row m attends key n: n in [lo_m, hi_m), and not m itself (its own key enters apart, always)."""
    return (offs_n[None, :] >= lo[:, None]) & (offs_n[None, :] < hi[:, None]) & (offs_n[None, :] != offs_m[:, None])


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, LO, HI, QB_KLO, QB_KHI, T, scale,
                s_t, s_h, o_t, o_h,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    offs_m, row_ok, lo, hi = _query_rows(LO, HI, pid_m, T, BM)
    offs_d = tl.arange(0, D)
    q_ptrs = offs_m[:, None] * s_t + h * s_h + offs_d[None, :]
    q = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
    k_self = tl.load(K + q_ptrs, mask=row_ok[:, None], other=0.0)
    v_self = tl.load(V + q_ptrs, mask=row_ok[:, None], other=0.0)
    m_i = tl.sum(q.to(tl.float32) * k_self.to(tl.float32), 1) * scale
    l_i = tl.full([BM], 1.0, tl.float32)
    acc = v_self.to(tl.float32)
    kv_lo = tl.load(QB_KLO + pid_m)  # min lo / max hi over the block's live rows (torch-side)
    kv_hi = tl.load(QB_KHI + pid_m)
    start = (kv_lo // BN) * BN
    for n0 in range(start, kv_hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        col_ok = offs_n < T
        kv_ptrs = offs_n[:, None] * s_t + h * s_h + offs_d[None, :]
        k = tl.load(K + kv_ptrs, mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        valid = _attends(offs_m, offs_n, lo, hi)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_ptrs, mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    acc = acc / l_i[:, None]
    o_ptrs = offs_m[:, None] * o_t + h * o_h + offs_d[None, :]
    tl.store(O + o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + h * T + offs_m, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, LO, HI, QB_KLO, QB_KHI, T, scale,
                   s_t, s_h, g_t, g_h,
                   D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    offs_m, row_ok, lo, hi = _query_rows(LO, HI, pid_m, T, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * s_t + h * s_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    g_ptrs = offs_m[:, None] * g_t + h * g_h + offs_d[None, :]
    do = tl.load(DO + g_ptrs, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + h * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + h * T + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BM, D], dtype=tl.float32)
    kv_lo = tl.load(QB_KLO + pid_m)
    kv_hi = tl.load(QB_KHI + pid_m)
    start = (kv_lo // BN) * BN
    for n0 in range(start, kv_hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        col_ok = offs_n < T
        kv_ptrs = offs_n[:, None] * s_t + h * s_h + offs_d[None, :]
        k = tl.load(K + kv_ptrs, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + kv_ptrs, mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        valid = _attends(offs_m, offs_n, lo, hi)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    tl.store(DQ + g_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bwd_dkv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, LO, HI, QB_FIRST, QB_LAST, QB_KLO, QB_KHI, T, scale,
                    s_t, s_h, g_t, g_h,
                    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    h = tl.program_id(1)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < T
    kv_ptrs = offs_n[:, None] * s_t + h * s_h + offs_d[None, :]
    k = tl.load(K + kv_ptrs, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_ptrs, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BN, D], dtype=tl.float32)
    dv = tl.zeros([BN, D], dtype=tl.float32)
    qb0 = tl.load(QB_FIRST + pid_n)
    qb1 = tl.load(QB_LAST + pid_n)
    for qb in range(qb0, qb1):
        klo = tl.load(QB_KLO + qb)
        khi = tl.load(QB_KHI + qb)
        if (klo < n0 + BN) & (khi > n0):
            offs_m, row_ok, lo, hi = _query_rows(LO, HI, qb, T, BM)
            q = tl.load(Q + offs_m[:, None] * s_t + h * s_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + offs_m[:, None] * g_t + h * g_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + h * T + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + h * T + offs_m, mask=row_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
            valid = _attends(offs_m, offs_n, lo, hi)
            p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
            dp = tl.dot(do, tl.trans(v), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
    g_ptrs = offs_n[:, None] * g_t + h * g_h + offs_d[None, :]
    tl.store(DK + g_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + g_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def pinned_config(device: torch.device) -> tuple[int, int, int]:
    """(BM, BN, num_warps). One pinned config; tiny blocks under the interpreter.
    On CUDA, GENRANK_TRITON_BLOCKS="BM,BN,WARPS" overrides it (benchmarking only)."""
    if INTERPRET or device.type != "cuda":
        return 16, 16, 1
    return settings.triton_blocks() or (64, 64, 4)


def _pad_d(x: torch.Tensor, D: int) -> torch.Tensor:
    if x.shape[-1] == D:
        return x.contiguous()
    return torch.nn.functional.pad(x, (0, D - x.shape[-1])).contiguous()


def _block_ranges(lo, hi, T, BM, BN):
    """Per query block key range [klo, khi) and per key block the query-block range that may touch it."""
    nqb, nkb = triton.cdiv(T, BM), triton.cdiv(T, BN)
    pad = nqb * BM - T
    live = hi > lo
    lo_p = torch.nn.functional.pad(torch.where(live, lo, T), (0, pad), value=T).view(nqb, BM)
    hi_p = torch.nn.functional.pad(torch.where(live, hi, 0), (0, pad), value=0).view(nqb, BM)
    qb_klo = lo_p.min(1).values.to(torch.int32)
    qb_khi = hi_p.max(1).values.to(torch.int32)
    kb = torch.arange(nkb, device=lo.device)
    touch = (qb_klo[None, :].long() < (kb[:, None] + 1) * BN) & (qb_khi[None, :].long() > kb[:, None] * BN)  # (nkb, nqb)
    any_ = touch.any(1)
    idx = torch.arange(nqb, device=lo.device)
    first = torch.where(touch, idx[None, :], nqb).min(1).values
    last = torch.where(touch, idx[None, :] + 1, 0).max(1).values
    first = torch.where(any_, first, 0).to(torch.int32)
    last = torch.where(any_, last, 0).to(torch.int32)
    return qb_klo.contiguous(), qb_khi.contiguous(), first.contiguous(), last.contiguous()


class TritonIntervalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lo, hi, scale):
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        T, H, D0 = q.shape
        D = max(16, triton.next_power_of_2(D0))
        k, v = k.to(q.dtype), v.to(q.dtype)  # tl.dot needs one dtype (autocast may mix them)
        qp, kp, vp = _pad_d(q, D), _pad_d(k, D), _pad_d(v, D)
        lo32, hi32 = lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous()
        BM, BN, warps = pinned_config(q.device)
        ranges = _block_ranges(lo32.long(), hi32.long(), T, BM, BN)
        prec = "ieee" if q.dtype == torch.float32 else "tf32"
        o = torch.empty_like(qp)
        lse = torch.empty(H, T, dtype=torch.float32, device=q.device)
        grid = (triton.cdiv(T, BM), H)
        _fwd_kernel[grid](qp, kp, vp, o, lse, lo32, hi32, ranges[0], ranges[1], T, scale,
                          qp.stride(0), qp.stride(1), o.stride(0), o.stride(1),
                          D=D, BM=BM, BN=BN, PREC=prec, num_warps=warps)
        ctx.save_for_backward(qp, kp, vp, o, lse, lo32, hi32, *ranges)
        ctx.scale, ctx.D0, ctx.cfg, ctx.prec = scale, D0, (BM, BN, warps), prec
        return o[..., :D0]

    @staticmethod
    def backward(ctx, dout):
        qp, kp, vp, o, lse, lo32, hi32, qb_klo, qb_khi, first, last = ctx.saved_tensors
        scale, D0, (BM, BN, warps), prec = ctx.scale, ctx.D0, ctx.cfg, ctx.prec
        T, H, D = qp.shape
        do = _pad_d(dout.to(qp.dtype), D)
        delta = (do.float() * o.float()).sum(-1).transpose(0, 1).contiguous()  # (H, T)
        # fp32 gradient buffers: the self term is added below before the final cast
        dq, dk, dv = (torch.empty(x.shape, dtype=torch.float32, device=x.device) for x in (qp, kp, vp))
        _bwd_dq_kernel[(triton.cdiv(T, BM), H)](qp, kp, vp, do, lse, delta, dq, lo32, hi32, qb_klo, qb_khi, T, scale,
                                                qp.stride(0), qp.stride(1), do.stride(0), do.stride(1),
                                                D=D, BM=BM, BN=BN, PREC=prec, num_warps=warps)
        _bwd_dkv_kernel[(triton.cdiv(T, BN), H)](qp, kp, vp, do, lse, delta, dk, dv, lo32, hi32,
                                                 first, last, qb_klo, qb_khi, T, scale,
                                                 qp.stride(0), qp.stride(1), do.stride(0), do.stride(1),
                                                 D=D, BM=BM, BN=BN, PREC=prec, num_warps=warps)
        # self term (j == q), elementwise
        qf, kf, vf, dof = qp.float(), kp.float(), vp.float(), do.float()
        s_self = (qf * kf).sum(-1) * scale  # (T, H)
        p_self = torch.exp(s_self - lse.transpose(0, 1))
        ds_self = p_self * ((dof * vf).sum(-1) - delta.transpose(0, 1))
        dq = dq + ds_self[..., None] * kf * scale
        dk = dk + ds_self[..., None] * qf * scale
        dv = dv + p_self[..., None] * dof
        return (dq[..., :D0].to(ctx.dtypes[0]), dk[..., :D0].to(ctx.dtypes[1]), dv[..., :D0].to(ctx.dtypes[2]), None, None, None)


def interval_attention_triton(q, k, v, lo, hi, scale: float | None = None):
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return TritonIntervalAttention.apply(q, k, v, lo, hi, float(scale))
