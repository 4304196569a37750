"""Student tokens (TM20K/MTGR) and their merges: history = every event (content + outcome in one token),
merged by LITM then PATM into groups (group = sum of its members' embeddings, time = newest member);
candidates = day D's impressions as content-only tokens, appended after the history and never merged.
The ablations' variants (no history, position as an input) are built from the same tokens."""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np

from contracts import HOUR_MS

from ..config import FeatureConfig
from .cross import counted_rows, scored_features
from .samples import Sample
from .tokens import (F_TYPE, TT_BEHAVIOR, TT_CANDIDATE, TT_IMP_EVENT, Targets, content_feats, event_feats,
                     valid_targets)

log = logging.getLogger("genrank.models.data")


def litm_groups(item_key: np.ndarray, T: int) -> np.ndarray:
    """LITM (TM20K): walk oldest -> newest; a token joins the most recent group of the same item
    if its index gap to that group's latest member is <= T, else opens a new group. Returns the
    group index (0..G-1, groups ordered by their first member) of every token."""
    n = len(item_key)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((np.arange(n), item_key))  # by item, then position
    k, pos = item_key[order], order
    same = np.r_[False, k[1:] == k[:-1]]
    gap = np.r_[0, pos[1:] - pos[:-1]]
    joins = same & (gap <= T)
    run = np.cumsum(~joins) - 1                    # run id in sorted order
    root = pos[np.flatnonzero(~joins)][run]        # first member of every run
    root_of = np.empty(n, np.int64)
    root_of[pos] = root
    is_root = root_of == np.arange(n)
    rank = np.cumsum(is_root) - 1                  # groups ordered by first member
    return rank[root_of]


def patm_groups(n: int, max_len: int, bounds: Sequence[float], factors: Sequence[int]) -> np.ndarray:
    """PATM (TM20K): split the n tokens (oldest..newest) into age segments counted from the newest
    (segment b covers ages [bounds[b-1], bounds[b]) x max_len), sum every factors[b] consecutive
    tokens inside a segment (the partial group sits at the old end). Returns group index per token."""
    if n == 0:
        return np.zeros(0, np.int64)
    age = np.arange(n)[::-1]  # 0 = newest
    edges = np.r_[0, np.round(np.asarray(bounds, float) * max_len).astype(np.int64)]
    edges[-1] = max(edges[-1], n)
    seg = np.clip(np.searchsorted(edges, age, side="right") - 1, 0, len(factors) - 1)
    f = np.asarray(factors, np.int64)[seg]
    within = age - edges[seg]
    key = seg * (n + 1) + within // f  # unique per (segment, chunk); larger = older
    # groups ordered oldest -> newest
    uniq, inv = np.unique(-key, return_inverse=True)
    return inv.astype(np.int64)


@dataclass
class StudentTokens:
    ev_feats: np.ndarray    # (Ne, F) history events (before merging)
    ev_ts: np.ndarray       # (Ne,) event time
    ev_group: np.ndarray    # (Ne,) group index within the sample
    hist_ts: np.ndarray     # (G,) newest member time of every group
    cand_feats: np.ndarray  # (Nc, F)
    cand_ts: np.ndarray     # (Nc,) request time
    cand_cross: np.ndarray  # (Nc, n_cross_features) the candidates' cross features (scored_features)
    targets: Targets
    n_events: int

    @property
    def n_groups(self) -> int:
        return int(self.hist_ts.shape[0])

    def with_candidates(self, idx) -> "StudentTokens":
        """The same history with only the candidates ``idx`` (a slice or an index array)."""
        tg = self.targets
        return replace(self, cand_feats=self.cand_feats[idx], cand_ts=self.cand_ts[idx], cand_cross=self.cand_cross[idx],
                       targets=Targets(*[getattr(tg, f.name)[idx] for f in fields(Targets)]))

    @property
    def n_tokens(self) -> int:
        return self.n_groups + int(self.cand_ts.shape[0])


def student_tokens(s: Sample, fc: FeatureConfig, max_len: int, litm: bool = True, litm_T: int = 3,
                   patm: bool = True, patm_bounds=(0.05, 0.25, 0.5, 1.0), patm_factors=(1, 2, 3, 4),
                   max_tokens: int | None = None, delay_ms: int = HOUR_MS,
                   counter_len: int | None = None) -> StudentTokens:
    """History = the newest max_len events (content + outcome in one token), merged LITM -> PATM;
    candidates = the sample's target impressions (content only, never merged), with their cross features
    counted under the serving delay delay_ms over the newest counter_len events of the sample (0: every
    one; None: the history tokens' events) and their item statistics."""
    tgt_idx = np.flatnonzero(valid_targets(s))
    hist = np.arange(s.n_events)[-max_len:] if max_len else np.arange(s.n_events)
    if max_tokens is not None and len(tgt_idx) > max_tokens:
        log.warning("user %s %s: %d targets exceed the token budget %d; keeping the newest", s.user_id, s.date,
                    len(tgt_idx), max_tokens)
        tgt_idx = tgt_idx[-max_tokens:]
    feats = event_feats(s, hist, TT_BEHAVIOR, fc)
    feats[s.is_imp[hist], F_TYPE] = TT_IMP_EVENT
    g = litm_groups(s.item_key[hist], litm_T) if litm else np.arange(len(hist))
    G = int(g.max()) + 1 if len(g) else 0
    if patm:
        g = patm_groups(G, max_len, patm_bounds, patm_factors)[g]
        G = int(g.max()) + 1 if len(g) else 0
    if max_tokens is not None and G + len(tgt_idx) > max_tokens:  # drop the oldest groups
        drop = G + len(tgt_idx) - max_tokens
        keep = g >= drop
        hist, feats, g = hist[keep], feats[keep], g[keep] - drop
        G -= drop
    hts = np.full(G, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(hts, g, s.ts[hist])
    cand_feats, cand_ts = content_feats(s, tgt_idx, TT_CANDIDATE), s.ts[tgt_idx]
    cross = scored_features(counted_rows(s, fc, counter_len, feats, s.ts[hist]), cand_feats, cand_ts - delay_ms,
                            s.item_stats[tgt_idx], fc)
    return StudentTokens(ev_feats=feats, ev_ts=s.ts[hist], ev_group=g, hist_ts=hts, cand_feats=cand_feats,
                         cand_ts=cand_ts, cand_cross=cross, targets=Targets.of(s, tgt_idx), n_events=len(hist))
