"""Bounds (lo, hi) of the single interval-attention contract, built over packed batches.

Every mask of the design is a choice of [lo_q, hi_q) per query (plus the query itself):

* causal:               lo_q = start(seq), hi_q = q
* delay (CADET):        hi_q = start + #{tokens of the seq with t <= t_q - delay}, capped at q (target rows)
* candidates (CADET serving, HSTU M-FALCON, SORT C2C isolation, MTGR per-request visibility):
                        candidate rows get lo = start, hi = start + #{history tokens visible at the
                        request time t_req - delay}; they attend to themselves, never to each other.
* sliding window + global tokens (SORT local attention, LazFormer):
                        history rows get lo_q = max(start, q - W) except the newest G history tokens
                        of each sequence, which keep lo = start ("global queries": SORT keeps the
                        path from the most recent items to the far history). Target / candidate rows
                        always keep the full visible range. A single interval per query cannot also
                        express "global keys", so this is the variant we implement.

Visibility uses the running maximum of token times: after token merging a group's time is
the time of its newest member and group times need not be monotone; counting the leading
tokens whose running-max time <= cutoff is conservative (a row can never see a group that
contains an event newer than its cutoff, nor a token that attended one).

All functions are torch-only and vectorised; indices are global (packed).
"""
from __future__ import annotations

import torch


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))


def seq_index(offsets: torch.Tensor) -> torch.Tensor:
    """(T,) sequence id of every packed token."""
    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)


def segment_cummax(x: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """Running max within each segment (x int64, segments contiguous and ordered)."""
    if x.numel() == 0:
        return x
    base = x.min()
    span = x.max() - base + 1
    y = torch.cummax((x - base) + seq * span, 0).values
    return y - seq * span + base


def visible_count(offsets: torch.Tensor, ts: torch.Tensor, q_seq: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """For queries in sequence q_seq with time cutoff `cut`, the number of leading tokens of that
    sequence (tokens given by offsets/ts) whose running-max time is <= cut."""
    if ts.numel() == 0:
        return torch.zeros_like(q_seq)
    seq = seq_index(offsets)
    rm = segment_cummax(ts, seq)
    base = rm.min()
    R = rm.max() - base
    span = R + 3
    keys = seq * span + (rm - base) + 1
    ckey = q_seq * span + torch.clamp(cut - base, min=-1, max=R) + 1
    glob = torch.searchsorted(keys, ckey, right=True)
    return glob - offsets[q_seq]


def causal_bounds(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    seq = seq_index(offsets)
    T = seq.numel()
    return offsets[seq].clone(), torch.arange(T, device=offsets.device)


def apply_window(lo: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor, window: int | None,
                 is_global: torch.Tensor | None = None) -> torch.Tensor:
    """Sliding window on the given rows (bool mask): lo = max(lo, q - W), except global rows."""
    if window is None:
        return lo
    q = torch.arange(lo.numel(), device=lo.device)
    win = torch.maximum(lo, q - int(window))
    sel = rows if is_global is None else rows & ~is_global
    return torch.where(sel, win, lo)


def newest_mask(offsets: torch.Tensor, rows: torch.Tensor, G: int) -> torch.Tensor:
    """Marks the newest G rows (within `rows`) of every sequence."""
    if G <= 0:
        return torch.zeros_like(rows)
    seq = seq_index(offsets)
    r = rows.long()
    # rank from the end among selected rows of the same sequence
    rev_cum = torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])  # selected rows at or after q (global)
    seq_tot_after = torch.nn.functional.pad(torch.flip(torch.cumsum(torch.flip(
        torch.zeros(offsets.numel() - 1, dtype=torch.long, device=rows.device).index_add_(0, seq, r), [0]), 0), [0])[1:], (0, 1))
    rank_from_end = rev_cum - seq_tot_after[seq]  # 1 = newest selected row of the sequence
    return rows & (rank_from_end <= G)


def teacher_bounds(offsets: torch.Tensor, ts: torch.Tensor, is_target: torch.Tensor, delay_ms: int,
                   window: int | None = None, n_global: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal for every row, delay mask on target rows, optional window on history rows."""
    lo, hi = causal_bounds(offsets)
    seq = seq_index(offsets)
    tq = torch.nonzero(is_target).flatten()
    if tq.numel():  # delay 0 still excludes same-time later tokens (own action token): capped at q
        cnt = visible_count(offsets, ts, seq[tq], ts[tq] - int(delay_ms))
        hi[tq] = torch.minimum(offsets[seq[tq]] + cnt, tq)
    hist = ~is_target
    lo = apply_window(lo, offsets, hist, window, newest_mask(offsets, hist, n_global) if window else None)
    return lo, hi


def candidate_layout(hist_len: torch.Tensor, cand_len: torch.Tensor):
    """Packed layout [hist_0, cand_0, hist_1, cand_1, ...]. Returns (offsets, hist_pos, cand_pos)."""
    seq_len = hist_len + cand_len
    offsets = lengths_to_offsets(seq_len)
    hoff = lengths_to_offsets(hist_len)
    coff = lengths_to_offsets(cand_len)
    hseq = seq_index(hoff)
    cseq = seq_index(coff)
    hist_pos = offsets[hseq] + (torch.arange(hseq.numel(), device=hist_len.device) - hoff[hseq])
    cand_pos = offsets[cseq] + hist_len[cseq] + (torch.arange(cseq.numel(), device=hist_len.device) - coff[cseq])
    return offsets, hist_pos, cand_pos


def candidate_bounds(hist_len: torch.Tensor, hist_ts: torch.Tensor, cand_len: torch.Tensor, cand_cut: torch.Tensor,
                     window: int | None = None, n_global: int = 0):
    """Bounds for [history | candidates] samples. History rows: causal (+ window / global);
    candidate rows: [start, start + visible history at cutoff) plus themselves."""
    offsets, hist_pos, cand_pos = candidate_layout(hist_len, cand_len)
    T = int(offsets[-1])
    dev = hist_len.device
    seq = seq_index(offsets)
    lo = offsets[seq].clone()
    hi = torch.arange(T, device=dev)
    hoff = lengths_to_offsets(hist_len)
    cseq = seq_index(lengths_to_offsets(cand_len))
    cnt = visible_count(hoff, hist_ts, cseq, cand_cut)
    hi[cand_pos] = offsets[cseq] + cnt
    if window is not None:
        is_hist = torch.zeros(T, dtype=torch.bool, device=dev)
        is_hist[hist_pos] = True
        lo = apply_window(lo, offsets, is_hist, window, newest_mask(offsets, is_hist, n_global))
    return offsets, hist_pos, cand_pos, lo, hi
