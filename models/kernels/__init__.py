"""GPU kernels with their torch reference, behind ONE dispatch function.

    from models.kernels import interval_attention
    out = interval_attention(q, k, v, lo, hi)            # (T, H, D) packed, bounds global

backend: one of contracts.ATTENTION_BACKENDS ("triton" forces the kernel: on CPU only under
TRITON_INTERPRET=1).
The environment variable GENRANK_ATTN_BACKEND overrides "auto" (for tests and
debugging); the Triton module is imported lazily so CPU code never needs it.
"""
from __future__ import annotations

import torch

from contracts import ATTENTION_BACKENDS, settings

from .reference import (dense_mask, interval_attention_reference, naive_interval_attention,
                        prefix_interval_attention, sdpa_interval_attention)

__all__ = ["interval_attention", "interval_attention_reference", "naive_interval_attention",
           "sdpa_interval_attention", "prefix_interval_attention", "dense_mask", "triton_available", "resolve_backend"]

_TRITON = None


def _triton_fn():
    global _TRITON
    if _TRITON is None:
        from .triton_attn import interval_attention_triton
        _TRITON = interval_attention_triton
    return _TRITON


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except Exception:
        return False


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        backend = settings.attn_backend()
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "reference"
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}: one of {', '.join(ATTENTION_BACKENDS)}")
    return backend


def interval_attention(q, k, v, lo, hi, scale: float | None = None, backend: str = "auto", chunk: int = 256,
                       n_keys: int | None = None):
    """q, k, v: (T, H, D); lo, hi: (T,) global key bounds. Query q attends [lo_q, hi_q) plus itself.
    n_keys (only with backend "prefix"): no hi exceeds it."""
    b = resolve_backend(backend, q.device)
    if b == "prefix":
        return prefix_interval_attention(q, k, v, lo, hi, scale, n_keys)
    if b == "triton":
        return _triton_fn()(q, k, v, lo, hi, scale)
    if b == "reference":
        return interval_attention_reference(q, k, v, lo, hi, scale, chunk=chunk)
    if b == "naive":
        return naive_interval_attention(q, k, v, lo, hi, scale)
    return sdpa_interval_attention(q, k, v, lo, hi, scale)
