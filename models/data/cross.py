"""What a scored token knows beside the sequence, computed before the model (and before the ONNX graph) by the
same code in training and serving: MTGR's statistical cross features over the user's log (``cross_counts``)
and the item statistics of the scored ad and its campaign over every user (``item_stat_features``)."""
from __future__ import annotations

import numpy as np

from contracts import DAY_MS, ITEM_STAT_COLUMNS, ITEM_STAT_LEVELS, ITEM_STAT_WINDOWS_DAYS

from ..config import FeatureConfig
from .samples import A_CLICK, A_NOCLICK, Sample
from .tokens import F_ACTION, F_BRAND, F_CAT, F_ITEM, N_ACTIONS, TT_BEHAVIOR, event_feats

CROSS_MATCH_FIELDS = (None, F_ITEM, F_CAT, F_BRAND)  # None = any event (the user's activity per action)
CROSS_ACTIONS = (1, 2, 3, 4, A_NOCLICK, A_CLICK)     # view, cart, fav, buy, impression without / with click


def n_counters(fc: FeatureConfig) -> int:
    return len(CROSS_MATCH_FIELDS) * len(CROSS_ACTIONS) * len(fc.cross_windows_days)


N_ITEM_STAT_FEATURES = 3 * len(ITEM_STAT_LEVELS) * len(ITEM_STAT_WINDOWS_DAYS)


def n_cross_features(fc: FeatureConfig) -> int:
    """The width of a scored token's features beside the sequence: the counters, then the item statistics."""
    return n_counters(fc) + (N_ITEM_STAT_FEATURES if fc.item_stats else 0)


def item_stat_features(counts: np.ndarray, fc: FeatureConfig) -> np.ndarray:
    """(Q, N_ITEM_STAT_FEATURES) float32 from (Q, len(ITEM_STAT_COLUMNS)) counts: per level (ad, campaign) and
    window, log1p of the impressions and of the clicks and the logit of the smoothed CTR. The campaign's CTR
    is smoothed towards fc.item_stats_prior_ctr, the ad's towards its campaign's smoothed CTR, both with
    fc.item_stats_pseudo_impressions; an id never shown (zero counts) gets its prior, never a NaN."""
    k, out = fc.item_stats_pseudo_impressions, []
    stat = {name: counts[:, j].astype(np.float64) for j, name in enumerate(ITEM_STAT_COLUMNS)}
    for days in ITEM_STAT_WINDOWS_DAYS:
        prior = np.full(len(counts), fc.item_stats_prior_ctr)
        for level in reversed(ITEM_STAT_LEVELS):  # the campaign first: it is the ad's prior
            shown = np.maximum(stat[f"{level}_impressions_{days}d"], 0)
            clicked = np.clip(stat[f"{level}_clicks_{days}d"], 0, shown)   # a corrupt record stays a rate
            prior = (clicked + k * prior) / (shown + k)
            out += [np.log1p(shown), np.log1p(clicked), np.log(prior) - np.log1p(-prior)]
    return np.stack(out, 1).astype(np.float32)


def scored_features(counted: tuple[np.ndarray, np.ndarray], q_feats: np.ndarray, q_cut: np.ndarray,
                    q_stats: np.ndarray, fc: FeatureConfig) -> np.ndarray:
    """(Q, n_cross_features) for the scored tokens: cross_counts over the ``counted`` (rows, times) under the
    cuts, then (with fc.item_stats) item_stat_features of their item statistics ``q_stats``."""
    cross = cross_counts(*counted, q_feats, q_cut, fc)
    return np.concatenate([cross, item_stat_features(q_stats, fc)], 1) if fc.item_stats else cross


def cross_counts(ev_feats: np.ndarray, ev_ts: np.ndarray, q_feats: np.ndarray, q_cut: np.ndarray,
                 fc: FeatureConfig) -> np.ndarray:
    """MTGR's target-side cross features (FeatureConfig.cross_windows_days), (Q, n_counters) float32:
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
        return out.reshape(Q, n_counters(fc))
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
    return np.log1p(out).reshape(Q, n_counters(fc))


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
