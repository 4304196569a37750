"""MTGR's statistical cross features on the scored token, counted before the model (and before the ONNX
graph) by the same code in training and serving."""
from __future__ import annotations

import numpy as np

from contracts import DAY_MS

from ..config import FeatureConfig
from .samples import A_CLICK, A_NOCLICK, Sample
from .tokens import F_ACTION, F_BRAND, F_CAT, F_ITEM, N_ACTIONS, TT_BEHAVIOR, event_feats

CROSS_MATCH_FIELDS = (None, F_ITEM, F_CAT, F_BRAND)  # None = any event (the user's activity per action)
CROSS_ACTIONS = (1, 2, 3, 4, A_NOCLICK, A_CLICK)     # view, cart, fav, buy, impression without / with click


def n_cross_features(fc: FeatureConfig) -> int:
    return len(CROSS_MATCH_FIELDS) * len(CROSS_ACTIONS) * len(fc.cross_windows_days)


def cross_counts(ev_feats: np.ndarray, ev_ts: np.ndarray, q_feats: np.ndarray, q_cut: np.ndarray,
                 fc: FeatureConfig) -> np.ndarray:
    """MTGR's target-side cross features (FeatureConfig.cross_windows_days), (Q, n_cross_features) float32:
    for every scored token q and every (match field m, action a, window w), log1p of the number of events e
    with action a, the same hashed m as q (any event for m = None; 0 if q's m is null) and
    q_cut - w < ts_e <= q_cut. q_cut is the scored impression's time minus the serving delay, so a counter
    sees exactly what serving sees. Events are token rows whose F_ACTION is an outcome (a teacher's
    content tokens carry none and count nothing). Exact, O((E + Q) log E) per field: events are sorted by
    (field, action, time) once and every counter is two binary searches."""
    windows = [int(round(w * DAY_MS)) for w in fc.cross_windows_days]
    Q, A = len(q_cut), len(CROSS_ACTIONS)
    out = np.zeros((Q, len(CROSS_MATCH_FIELDS), A, len(windows)), np.float32)
    code = np.full(N_ACTIONS, -1, np.int64)
    code[list(CROSS_ACTIONS)] = np.arange(A)
    ev_code = code[ev_feats[:, F_ACTION]]
    keep = ev_code >= 0
    if Q == 0 or not keep.any() or not windows:
        return out.reshape(Q, n_cross_features(fc))
    ts, ev_code, ev_feats = ev_ts[keep], ev_code[keep], ev_feats[keep]
    t0 = int(ts.min())
    span = int(ts.max()) - t0
    # one time slot per ms, plus the "before every event" slot of each key; int64 holds (field < 2^24) x
    # (6 actions) x (a 10-year span in ms)
    R = span + 2
    # every bound of a query at once: its cut (newest) and the cut minus each window (oldest), clipped to -1 so
    # a bound lands just before the key's first event (the previous key ends at R - 2)
    cuts = np.clip(q_cut[:, None] - np.array([0] + windows, np.int64) - t0, -1, span)   # (Q, 1 + W)
    for m, col in enumerate(CROSS_MATCH_FIELDS):
        f = np.ones(len(ts), np.int64) if col is None else ev_feats[:, col]
        qf = np.ones(Q, np.int64) if col is None else q_feats[:, col]
        sorted_keys = np.sort((f * A + ev_code) * R + (ts - t0))
        base = (qf[:, None] * A + np.arange(A)) * R                                      # (Q, A)
        found = np.searchsorted(sorted_keys, base[:, :, None] + cuts[:, None, :], side="right")
        out[:, m] = np.where((qf > 0)[:, None, None], found[:, :, :1] - found[:, :, 1:], 0)
    return np.log1p(out).reshape(Q, n_cross_features(fc))


def outcome_rows(s: Sample, fc: FeatureConfig, counter_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The newest ``counter_len`` events of ``s`` (0: every one) as the rows cross_counts counts, with their
    times: one row per event with its ids and outcome, as a behaviour token or an impression's action token
    carries them. The models' counter_len (ModelSizes.counter_events): the user's log the online store keeps,
    longer than the history the graph sees."""
    idx = np.arange(s.n_events)[-counter_len:] if counter_len else np.arange(s.n_events)
    return event_feats(s, idx, TT_BEHAVIOR, fc), s.ts[idx]


def counted_rows(s: Sample, fc: FeatureConfig, counter_len: int | None, kept_rows: np.ndarray,
                 kept_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a model's cross features count (TeacherConfig / StudentConfig.counter_len): the rows its tokens keep
    (``kept_rows``, ``kept_ts``) when counter_len is None, else the newest counter_len events of ``s``."""
    return (kept_rows, kept_ts) if counter_len is None else outcome_rows(s, fc, counter_len)
