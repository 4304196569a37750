"""Serving requests: a user's stored events and a request's candidates as student tokens, through the
tokenisation training uses (samples.encode_table, student_tokens, scored_features)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa

from contracts import ITEM_STAT_COLUMNS

from ..config import FeatureConfig
from .cross import counted_rows, scored_features
from .samples import READ_COLUMNS, SAMPLE_ARRAYS, Sample, encode_table, make_sample
from .student_tokens import StudentTokens, student_tokens
from .tokens import TT_CANDIDATE, Targets, content_feats

def sample_from_frame(events: pd.DataFrame, fc: FeatureConfig, date: str = "") -> Sample:
    """One user's events (the training_samples / user_sequences columns; missing ones are null) as a
    Sample, hashed exactly as at training time. Serving builds histories and candidates with this."""
    types = {"ts_ms": pa.int64(), "is_target": pa.bool_(), "position": pa.int64(), "position_bucket": pa.int64(),
             "label": pa.int64(), "dwell_ms": pa.float64(), **{c: pa.int64() for c in ITEM_STAT_COLUMNS}}
    n = len(events)
    tbl = pa.table({c: pa.array(events[c].tolist() if c in events.columns else [None] * n,
                                type=types.get(c, pa.string()), from_pandas=True) for c in READ_COLUMNS})
    d = encode_table(tbl, fc)
    if not len(d["ts"]):
        return Sample(user_id="", date=date, teacher_p=np.zeros(0, np.float32),
                      **{k: d[k] for k in SAMPLE_ARRAYS if k != "teacher_p"})
    return make_sample(d, date, None)


def request_tokens(history: Sample, candidates: Sample, cfg) -> StudentTokens:
    """Serving: one request's student tokens. The history (every event of ``history``, targets or
    not) is cut to the newest max_len events and merged LITM -> PATM as at training time; every row
    of ``candidates`` becomes a content-only candidate token at its own time (the request time). The
    cross features count the newest counter_len events of ``history`` (StudentConfig.counter_len); the
    candidates' item statistics are their ``item_stats`` (the online store's, filled in by the service)."""
    hist = replace(history, is_target=np.zeros(history.n_events, bool))
    h = student_tokens(hist, cfg.features, cfg.max_len, cfg.litm, cfg.litm_T, cfg.patm, cfg.patm_bounds,
                       cfg.patm_factors, delay_ms=cfg.mask.delay_ms)
    idx = np.arange(candidates.n_events)
    cand_feats, cand_ts = content_feats(candidates, idx, TT_CANDIDATE), candidates.ts[idx]
    counted = counted_rows(hist, cfg.features, cfg.counter_len, h.ev_feats, h.ev_ts)
    cross = scored_features(counted, cand_feats, cand_ts - cfg.mask.delay_ms, candidates.item_stats, cfg.features)
    return replace(h, cand_feats=cand_feats, cand_ts=cand_ts, cand_cross=cross, targets=Targets.of(candidates, idx))
