"""Teacher tokens (CADET/HSTU): impressions become (content, action) pairs, organic behaviors one token; the
action token carries label, click type, dwell and the historical position; the content token of day D's
impressions is where the model predicts. The scored impression's own action token is never visible to it
(causal + delay mask)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from contracts import HOUR_MS

from ..config import FeatureConfig
from .cross import counted_rows, scored_features
from .samples import Sample
from .tokens import (N_FIELDS, TT_BEHAVIOR, TT_IMP_ACTION, TT_IMP_CONTENT, Targets, content_feats, event_feats,
                     valid_targets)

log = logging.getLogger("genrank.models.data")


@dataclass
class TeacherTokens:
    feats: np.ndarray     # (T, F)
    ts: np.ndarray        # (T,)
    is_target: np.ndarray  # (T,) content tokens of target impressions
    cross: np.ndarray     # (n_targets, n_cross_features) the targets' cross features (scored_features)
    targets: Targets
    n_events: int

    @property
    def n_tokens(self) -> int:
        return int(self.ts.shape[0])


def teacher_tokens(s: Sample, fc: FeatureConfig, max_tokens: int, delay_ms: int = HOUR_MS,
                   counter_len: int | None = None) -> TeacherTokens:
    """Interleaved (content, action) tokens for impressions, one token per behavior, in time order.
    The oldest non-target events are dropped until the sequence fits max_tokens. delay_ms: the serving
    delay the targets' cross features are counted under; they count the kept tokens' outcomes, or with a
    ``counter_len`` the sample's newest counter_len events (0: every one), dropped ones included (TeacherConfig)."""
    tgt = valid_targets(s)
    cost = np.where(s.is_imp, 2, 1)
    keep = np.ones(s.n_events, bool)
    total = int(cost.sum())
    if total > max_tokens:
        drop_order = np.flatnonzero(~tgt)  # oldest first
        excess = total - max_tokens
        c = np.cumsum(cost[drop_order])
        n_drop = int(np.searchsorted(c, excess) + 1)
        keep[drop_order[:n_drop]] = False
        if cost[keep].sum() > max_tokens:  # targets alone too long: keep the newest
            log.warning("user %s %s: targets exceed the token budget %d; keeping the newest", s.user_id, s.date, max_tokens)
            ti = np.flatnonzero(keep)
            c = np.cumsum(cost[ti][::-1])
            keep[ti[::-1][c > max_tokens]] = False
    ev = np.flatnonzero(keep)
    n_tok = cost[ev]
    starts = np.r_[0, np.cumsum(n_tok)[:-1]]
    T = int(n_tok.sum())
    feats = np.zeros((T, N_FIELDS), np.int64)
    imp = s.is_imp[ev]
    beh = ~imp
    # behaviors: content + action in one token
    bi = ev[beh]
    feats[starts[beh]] = event_feats(s, bi, TT_BEHAVIOR, fc)
    ii = ev[imp]
    feats[starts[imp]] = content_feats(s, ii, TT_IMP_CONTENT)
    # The action token carries its impression's ids too: both tokens of a pair share a timestamp, so under
    # time RoPE nothing but content could tie an outcome to its ad, and a 2-layer teacher learnt slowly.
    feats[starts[imp] + 1] = event_feats(s, ii, TT_IMP_ACTION, fc)
    ts = np.repeat(s.ts[ev], n_tok)
    is_target = np.zeros(T, bool)
    tmask = tgt[ev]
    is_target[starts[tmask]] = True
    cross = scored_features(counted_rows(s, fc, counter_len, feats, ts), feats[is_target], ts[is_target] - delay_ms,
                            s.item_stats[ev[tmask]], fc)
    return TeacherTokens(feats=feats, ts=ts, is_target=is_target, cross=cross, targets=Targets.of(s, ev[tmask]),
                         n_events=len(ev))
