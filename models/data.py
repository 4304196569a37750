"""Training samples -> tokens -> packed jagged batches.

Reading (`iter_samples`): the `training_samples` contract (one row per event, rows contiguous
per user, sorted by (user_id, ts_ms, event_rank), one file set per day `date=D`). Files are
streamed one Parquet row group at a time; the rows of the last user of a row group are carried
over to the next, so memory is bounded by one row group (+ the shuffle buffer), whatever the
number of days. One sample = one (user, day D).

Hashing (`hash_ids`): stable, vectorised (pandas.util.hash_array with a fixed 16-byte key,
never Python's salted hash()); id -> 1 + h % (size - 1); null -> 0.

Tokens. Every token is a row of F=13 integer features summed through one embedding table
(see layers.TokenEmbedding): item, campaign, advertiser, category, brand, surface, device,
token type, action, position, click type, dwell bucket, hour of day.
* Teacher (`teacher_tokens`, CADET/HSTU): impressions become (content, action) pairs, organic
  behaviors one token; the action token carries label, click type, dwell and the historical
  position; the content token of day D's impressions is where the model predicts. The scored
  impression's own action token is never visible to it (causal + delay mask).
* Student (`student_tokens`, TM20K/MTGR): history = every event (content + outcome in one token),
  merged by LITM then PATM into groups (group = sum of its members' embeddings, time = newest
  member); candidates = day D's impressions as content-only tokens, appended after the history
  and never merged.

Packing (`PackedLoader`): deterministic shuffle (file order by seed+epoch, then a seeded shuffle
buffer), batches filled greedily up to a fixed token budget (no padding; offsets).
"""
from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .config import HOUR_MS, FeatureConfig

DAY_MS = 86_400_000
log = logging.getLogger("genrank.models.data")
# token feature columns
F_ITEM, F_CAMPAIGN, F_ADV, F_CAT, F_BRAND, F_SURFACE, F_DEVICE, F_TYPE, F_ACTION, F_POS, F_CTYPE, F_DWELL, F_HOUR = range(13)
N_FIELDS = 13
ID_FIELDS = (F_ITEM, F_CAMPAIGN, F_ADV)  # high-cardinality ids a model can memorise (BackboneConfig.id_dropout)
# token types
TT_IMP_CONTENT, TT_IMP_ACTION, TT_BEHAVIOR, TT_CANDIDATE, TT_IMP_EVENT = 1, 2, 3, 4, 5
N_TOKEN_TYPES = 8
# action vocabulary: organic actions 1..4; impression outcome 5 (no click) / 6 (click)
ACTION_IDS = {"view": 1, "cart": 2, "fav": 3, "buy": 4}
A_NOCLICK, A_CLICK = 5, 6
N_ACTIONS = 8
CLICK_TYPE_IDS = {"view_details": 1, "add_to_cart": 2, "follow": 3}
N_HOURS = 25

READ_COLUMNS = ["user_id", "ts_ms", "is_target", "event_kind", "item_id", "campaign_id", "advertiser_id",
                "category_id", "brand_id", "surface", "device", "action", "position", "position_bucket",
                "label", "click_type", "dwell_ms", "request_id", "impression_id"]
HASHED = [("item_id", "item_buckets"), ("campaign_id", "campaign_buckets"), ("advertiser_id", "advertiser_buckets"),
          ("category_id", "category_buckets"), ("brand_id", "brand_buckets"), ("surface", "surface_buckets"),
          ("device", "device_buckets")]


def field_vocab(fc: FeatureConfig) -> list[int]:
    """Vocabulary size of each of the N_FIELDS token feature columns."""
    return [fc.item_buckets, fc.campaign_buckets, fc.advertiser_buckets, fc.category_buckets, fc.brand_buckets,
            fc.surface_buckets, fc.device_buckets, N_TOKEN_TYPES, N_ACTIONS, fc.max_position + 1, 4,
            fc.dwell_buckets, N_HOURS]


# ----------------------------------------------------------------------------- hashing

def stable_hash(values: np.ndarray, key: str = "genrank-hash-v01") -> np.ndarray:
    """uint64 hash of an object array of strings (None allowed), stable across processes."""
    return pd.util.hash_array(np.asarray(values, dtype=object), hash_key=key, categorize=True)


def hash_ids(values: np.ndarray, size: int, key: str = "genrank-hash-v01") -> np.ndarray:
    """Maps string ids to [1, size); nulls to 0."""
    values = np.asarray(values, dtype=object)
    h = stable_hash(values, key)
    out = (1 + (h % np.uint64(max(1, size - 1)))).astype(np.int64)
    out[pd.isna(values)] = 0
    return out


# ----------------------------------------------------------------------------- samples

@dataclass
class Sample:
    """One (user, day) with per-event numpy arrays (events sorted by time)."""

    user_id: str
    date: str
    ts: np.ndarray           # int64 ms
    is_target: np.ndarray    # bool
    is_imp: np.ndarray       # bool (impression vs behavior)
    ids: np.ndarray          # (E, 7) int64 hashed ids (item..device)
    item_key: np.ndarray     # uint64 full item hash (LITM equality)
    action: np.ndarray       # int64 action id (ACTION_IDS / A_CLICK / A_NOCLICK)
    position: np.ndarray     # int64, 0 = null
    bucket: np.ndarray       # int64, -1 = null
    label: np.ndarray        # int64, -1 = null
    click_type: np.ndarray   # int64 0..3
    dwell_ms: np.ndarray     # float64, nan = null
    impression_id: np.ndarray  # object
    teacher_p: np.ndarray    # float32, nan = missing

    @property
    def n_events(self) -> int:
        return int(self.ts.shape[0])


SAMPLE_ARRAYS = ("ts", "is_target", "is_imp", "ids", "item_key", "action", "position", "bucket", "label",
                 "click_type", "dwell_ms", "impression_id", "teacher_p")


def split_by_targets(s: Sample, max_targets: int) -> list[Sample]:
    """A user-day with more targets than one sequence can hold becomes several samples (MTGR-style
    request groups), so every target is scored: part k keeps the events up to its last target and marks
    only its own targets; earlier targets stay as ordinary events, seen under the same delay mask."""
    targets = np.flatnonzero(s.is_target & s.is_imp & (s.label >= 0))
    if len(targets) <= max_targets:
        return [s]
    parts = []
    for first in range(0, len(targets), max_targets):
        chunk = targets[first:first + max_targets]
        end = int(chunk[-1]) + 1
        part = replace(s, **{f: getattr(s, f)[:end] for f in SAMPLE_ARRAYS})
        part.is_target = np.zeros(end, bool)
        part.is_target[chunk] = True
        parts.append(part)
    return parts


def list_sample_files(paths: str | Sequence[str]) -> list[str]:
    """Accepts files, `date=D` folders or a dataset root (date=*/part-*.parquet); sorted."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        p = str(p)
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "date=*", "*.parquet"))) or sorted(glob.glob(os.path.join(p, "*.parquet")))
            out.extend(found)
        else:
            out.append(p)
    return out


def _date_of(path: str) -> str | None:
    m = re.search(r"date=(\d{4}-\d{2}-\d{2})", path)
    return m.group(1) if m else None


def _col(tbl: pa.Table, name: str) -> np.ndarray:
    return tbl.column(name).to_numpy(zero_copy_only=False)


def _num(tbl: pa.Table, name: str, fill, dtype) -> np.ndarray:
    c = tbl.column(name)
    return c.fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype) if c.null_count else c.to_numpy(zero_copy_only=False).astype(dtype)


def _convert(tbl: pa.Table, fc: FeatureConfig) -> dict[str, np.ndarray]:
    sizes = fc.table_sizes()
    item = _col(tbl, "item_id")
    ids = np.stack([hash_ids(_col(tbl, c), sizes[s], fc.hash_key) for c, s in HASHED], 1)
    kind = _col(tbl, "event_kind")
    is_imp = kind == "impression"
    act = _col(tbl, "action")
    action = pd.Series(act, dtype=object).map(ACTION_IDS).fillna(0).to_numpy(np.int64)
    label = _num(tbl, "label", -1, np.int64)
    action = np.where(is_imp, np.where(label == 1, A_CLICK, A_NOCLICK), action)
    ctype = pd.Series(_col(tbl, "click_type"), dtype=object).map(CLICK_TYPE_IDS).fillna(0).to_numpy(np.int64)
    dwell = tbl.column("dwell_ms").cast(pa.float64()).to_numpy(zero_copy_only=False)
    dwell = np.where(pd.isna(dwell), np.nan, dwell).astype(np.float64)
    return dict(
        user_id=_col(tbl, "user_id"), ts=_num(tbl, "ts_ms", 0, np.int64), is_target=_num(tbl, "is_target", False, bool),
        is_imp=is_imp, ids=ids, item_key=stable_hash(item, fc.hash_key), action=action,
        position=_num(tbl, "position", 0, np.int64), bucket=_num(tbl, "position_bucket", -1, np.int64),
        label=label, click_type=ctype, dwell_ms=dwell, impression_id=_col(tbl, "impression_id"))


def _slice(d: dict, a: int, b: int) -> dict:
    return {k: v[a:b] for k, v in d.items()}


def _concat(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    return {k: np.concatenate([a[k], b[k]]) for k in b}


class TeacherProbs:
    """Teacher probabilities keyed by impression_id (DataFrame, Series or Parquet path(s)).
    Column with the probability: `p` (or `teacher_p` / `prob`)."""

    def __init__(self, probs):
        if isinstance(probs, TeacherProbs):
            self.s = probs.s
            return
        if isinstance(probs, (str, os.PathLike, list, tuple)):
            probs = pd.concat([pd.read_parquet(p) for p in list_sample_files(probs)], ignore_index=True)
        if isinstance(probs, pd.DataFrame):
            col = next(c for c in ("p", "teacher_p", "prob") if c in probs.columns)
            probs = probs.set_index("impression_id")[col]
        self.s = probs[~probs.index.duplicated(keep="last")].astype(np.float32)

    def lookup(self, impression_ids: np.ndarray) -> np.ndarray:
        idx = self.s.index.get_indexer(pd.Index(impression_ids.astype(object)))
        vals = self.s.to_numpy()
        return np.where(idx >= 0, vals[np.clip(idx, 0, None)], np.nan).astype(np.float32)


def _make_sample(d: dict, date: str, teacher: TeacherProbs | None) -> Sample:
    ts = d["ts"]
    order = np.argsort(ts, kind="stable")  # rows are sorted already; this is a guard
    d = {k: v[order] for k, v in d.items()}
    tp = np.full(len(ts), np.nan, np.float32)
    if teacher is not None:
        t = d["is_target"]
        if t.any():
            tp[t] = teacher.lookup(d["impression_id"][t])
    return Sample(user_id=str(d["user_id"][0]), date=date, ts=d["ts"], is_target=d["is_target"], is_imp=d["is_imp"],
                  ids=d["ids"], item_key=d["item_key"], action=d["action"], position=d["position"], bucket=d["bucket"],
                  label=d["label"], click_type=d["click_type"], dwell_ms=d["dwell_ms"],
                  impression_id=d["impression_id"], teacher_p=tp)


def iter_file_samples(path: str, fc: FeatureConfig, teacher: TeacherProbs | None = None) -> Iterator[Sample]:
    """Streams one Parquet file row group by row group, yielding one Sample per user."""
    pf = pq.ParquetFile(path)
    cols = [c for c in READ_COLUMNS if c in pf.schema_arrow.names]
    date = _date_of(path) or ""
    carry = None
    for rg in range(pf.num_row_groups):
        tbl = pf.read_row_group(rg, columns=cols)
        if tbl.num_rows == 0:
            continue
        d = _concat(carry, _convert(tbl, fc))
        users = d["user_id"]
        starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
        bounds = np.r_[starts, len(users)]
        for a, b in zip(bounds[:-2], bounds[1:-1]):
            yield _make_sample(_slice(d, a, b), date, teacher)
        carry = _slice(d, bounds[-2], bounds[-1])
    if carry is not None and len(carry["ts"]):
        yield _make_sample(carry, date, teacher)


def iter_samples(paths, fc: FeatureConfig, teacher: TeacherProbs | None = None, seed: int | None = None,
                 epoch: int = 0, shuffle_buffer: int = 0) -> Iterator[Sample]:
    """All samples of the given files. With a seed: files in a seeded order, then a seeded
    shuffle buffer (bounded memory). Deterministic for a given (seed, epoch)."""
    files = list_sample_files(paths)
    if seed is None:
        for f in files:
            yield from iter_file_samples(f, fc, teacher)
        return
    rng = np.random.default_rng([seed, epoch])
    files = [files[i] for i in rng.permutation(len(files))]
    buf: list[Sample] = []
    for f in files:
        for s in iter_file_samples(f, fc, teacher):
            if len(buf) < max(1, shuffle_buffer):
                buf.append(s)
                continue
            j = int(rng.integers(len(buf)))
            yield buf[j]
            buf[j] = s
    order = rng.permutation(len(buf))
    for j in order:
        yield buf[j]


# ----------------------------------------------------------------------------- tokenisation

def _hour(ts: np.ndarray) -> np.ndarray:
    return (ts // 3_600_000) % 24 + 1


def _dwell_bucket(dwell_ms: np.ndarray, n: int) -> np.ndarray:
    s = np.nan_to_num(dwell_ms / 1000.0, nan=-1.0)
    b = 1 + np.clip(np.floor(np.log2(1.0 + np.maximum(s, 0.0))), 0, n - 2)
    return np.where(s < 0, 0, b).astype(np.int64)


def _content_feats(s: Sample, idx: np.ndarray, ttype: int) -> np.ndarray:
    f = np.zeros((len(idx), N_FIELDS), np.int64)
    f[:, :7] = s.ids[idx]
    f[:, F_TYPE] = ttype
    f[:, F_HOUR] = _hour(s.ts[idx])
    return f


def _action_feats(s: Sample, idx: np.ndarray, fc: FeatureConfig) -> np.ndarray:
    """Outcome part of an event: action, historical position, click type, dwell bucket."""
    f = np.zeros((len(idx), N_FIELDS), np.int64)
    f[:, F_ACTION] = s.action[idx]
    f[:, F_POS] = np.clip(s.position[idx], 0, fc.max_position)
    f[:, F_CTYPE] = s.click_type[idx]
    f[:, F_DWELL] = _dwell_bucket(s.dwell_ms[idx], fc.dwell_buckets)
    f[:, F_HOUR] = _hour(s.ts[idx])
    return f


# ----------------------------------------------------------------------------- cross features

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
    for m, col in enumerate(CROSS_MATCH_FIELDS):
        f = np.ones(len(ts), np.int64) if col is None else ev_feats[:, col]
        qf = np.ones(Q, np.int64) if col is None else q_feats[:, col]
        sorted_keys = np.sort((f * A + ev_code) * R + (ts - t0))
        for a in range(A):
            base = (qf * A + a) * R
            # clipped to -1, a bound lands just before the key's first event (the previous key ends at R - 2)
            newest = np.searchsorted(sorted_keys, base + np.clip(q_cut - t0, -1, span), side="right")
            for w, width in enumerate(windows):
                oldest = np.searchsorted(sorted_keys, base + np.clip(q_cut - width - t0, -1, span), side="right")
                out[:, m, a, w] = np.where(qf > 0, newest - oldest, 0)
    return np.log1p(out).reshape(Q, n_cross_features(fc))


@dataclass
class Targets:
    """Per target impression (concatenated over a batch)."""

    bucket: np.ndarray
    label: np.ndarray
    click_type: np.ndarray
    log_dwell: np.ndarray     # log1p(dwell seconds), nan if unknown
    teacher_p: np.ndarray
    impression_id: np.ndarray
    user_id: np.ndarray

    @staticmethod
    def of(s: Sample, idx: np.ndarray) -> "Targets":
        return Targets(bucket=np.clip(s.bucket[idx], 0, None), label=np.clip(s.label[idx], 0, 1),
                       click_type=s.click_type[idx], log_dwell=np.log1p(s.dwell_ms[idx] / 1000.0),
                       teacher_p=s.teacher_p[idx], impression_id=s.impression_id[idx],
                       user_id=np.full(len(idx), s.user_id, dtype=object))

    @staticmethod
    def cat(ts: list["Targets"]) -> "Targets":
        return Targets(*[np.concatenate([getattr(t, f) for t in ts]) for f in
                         ("bucket", "label", "click_type", "log_dwell", "teacher_p", "impression_id", "user_id")])


def _valid_targets(s: Sample) -> np.ndarray:
    return s.is_target & s.is_imp & (s.label >= 0)


@dataclass
class TeacherTokens:
    feats: np.ndarray     # (T, F)
    ts: np.ndarray        # (T,)
    is_target: np.ndarray  # (T,) content tokens of target impressions
    cross: np.ndarray     # (n_targets, n_cross_features) the targets' cross features (cross_counts)
    targets: Targets
    n_events: int

    @property
    def n_tokens(self) -> int:
        return int(self.ts.shape[0])


def teacher_tokens(s: Sample, fc: FeatureConfig, max_tokens: int, delay_ms: int = HOUR_MS) -> TeacherTokens:
    """Interleaved (content, action) tokens for impressions, one token per behavior, in time order.
    The oldest non-target events are dropped until the sequence fits max_tokens. delay_ms: the serving
    delay the targets' cross features are counted under."""
    tgt = _valid_targets(s)
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
    feats[starts[beh]] = _content_feats(s, bi, TT_BEHAVIOR) + _action_feats(s, bi, fc) * (np.arange(N_FIELDS) != F_HOUR)
    ii = ev[imp]
    feats[starts[imp]] = _content_feats(s, ii, TT_IMP_CONTENT)
    # The action token carries its impression's ids too: both tokens of a pair share a timestamp, so under
    # time RoPE nothing but content could tie an outcome to its ad, and a 2-layer teacher learnt slowly.
    feats[starts[imp] + 1] = _content_feats(s, ii, TT_IMP_ACTION) + _action_feats(s, ii, fc) * (np.arange(N_FIELDS) != F_HOUR)
    ts = np.repeat(s.ts[ev], n_tok)
    is_target = np.zeros(T, bool)
    tmask = tgt[ev]
    is_target[starts[tmask]] = True
    cross = cross_counts(feats, ts, feats[is_target], ts[is_target] - delay_ms, fc)
    return TeacherTokens(feats=feats, ts=ts, is_target=is_target, cross=cross, targets=Targets.of(s, ev[tmask]),
                         n_events=len(ev))


# ----------------------------------------------------------------------------- student merges

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
    cand_cross: np.ndarray  # (Nc, n_cross_features) the candidates' cross features (cross_counts)
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
                   max_tokens: int | None = None, delay_ms: int = HOUR_MS) -> StudentTokens:
    """History = the newest max_len events (content + outcome in one token), merged LITM -> PATM;
    candidates = the sample's target impressions (content only, never merged), with their cross features
    counted over that history under the serving delay delay_ms."""
    tgt_idx = np.flatnonzero(_valid_targets(s))
    hist = np.arange(s.n_events)[-max_len:] if max_len else np.arange(s.n_events)
    if max_tokens is not None and len(tgt_idx) > max_tokens:
        log.warning("user %s %s: %d targets exceed the token budget %d; keeping the newest", s.user_id, s.date,
                    len(tgt_idx), max_tokens)
        tgt_idx = tgt_idx[-max_tokens:]
    feats = _content_feats(s, hist, TT_BEHAVIOR)
    feats[s.is_imp[hist], F_TYPE] = TT_IMP_EVENT
    feats += _action_feats(s, hist, fc) * (np.arange(N_FIELDS) != F_HOUR)
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
    cand_feats, cand_ts = _content_feats(s, tgt_idx, TT_CANDIDATE), s.ts[tgt_idx]
    return StudentTokens(ev_feats=feats, ev_ts=s.ts[hist], ev_group=g, hist_ts=hts, cand_feats=cand_feats,
                         cand_ts=cand_ts, cand_cross=cross_counts(feats, s.ts[hist], cand_feats, cand_ts - delay_ms, fc),
                         targets=Targets.of(s, tgt_idx), n_events=len(hist))


def sample_from_frame(events: pd.DataFrame, fc: FeatureConfig, date: str = "") -> Sample:
    """One user's events (the training_samples / user_sequences columns; missing ones are null) as a
    Sample, hashed exactly as at training time. Serving builds histories and candidates with this."""
    types = {"ts_ms": pa.int64(), "is_target": pa.bool_(), "position": pa.int64(), "position_bucket": pa.int64(),
             "label": pa.int64(), "dwell_ms": pa.float64()}
    n = len(events)
    tbl = pa.table({c: pa.array(events[c].tolist() if c in events.columns else [None] * n,
                                type=types.get(c, pa.string()), from_pandas=True) for c in READ_COLUMNS})
    d = _convert(tbl, fc)
    if not len(d["ts"]):
        return Sample(user_id="", date=date, teacher_p=np.zeros(0, np.float32), **{k: d[k] for k in SAMPLE_ARRAYS[:-1]})
    return _make_sample(d, date, None)


def request_tokens(history: Sample, candidates: Sample, cfg) -> StudentTokens:
    """Serving: one request's student tokens. The history (every event of ``history``, targets or
    not) is cut to the newest max_len events and merged LITM -> PATM as at training time; every row
    of ``candidates`` becomes a content-only candidate token at its own time (the request time)."""
    hist = replace(history, is_target=np.zeros(history.n_events, bool))
    h = student_tokens(hist, cfg.features, cfg.max_len, cfg.litm, cfg.litm_T, cfg.patm, cfg.patm_bounds,
                       cfg.patm_factors, delay_ms=cfg.mask.delay_ms)
    idx = np.arange(candidates.n_events)
    cand_feats, cand_ts = _content_feats(candidates, idx, TT_CANDIDATE), candidates.ts[idx]
    cross = cross_counts(h.ev_feats, h.ev_ts, cand_feats, cand_ts - cfg.mask.delay_ms, cfg.features)
    return replace(h, cand_feats=cand_feats, cand_ts=cand_ts, cand_cross=cross, targets=Targets.of(candidates, idx))


# ----------------------------------------------------------------------------- batches

@dataclass
class Batch:
    kind: str                                  # "teacher" | "student"
    targets: Targets
    n_events: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, device) -> "Batch":
        return Batch(self.kind, self.targets, self.n_events, {k: v.to(device, non_blocking=True) for k, v in self.tensors.items()})

    @property
    def n_tokens(self) -> int:
        t = self.tensors
        return int(t["offsets"][-1]) if self.kind == "teacher" else int(t["hist_len"].sum() + t["cand_len"].sum())

    def target_tensors(self, device) -> dict[str, torch.Tensor]:
        tg = self.targets
        return dict(bucket=torch.as_tensor(tg.bucket, device=device), label=torch.as_tensor(tg.label, dtype=torch.float32, device=device),
                    click_type=torch.as_tensor(tg.click_type, device=device),
                    log_dwell=torch.as_tensor(tg.log_dwell, dtype=torch.float32, device=device),
                    teacher_p=torch.as_tensor(tg.teacher_p, dtype=torch.float32, device=device))


def collate_teacher(toks: list[TeacherTokens]) -> Batch:
    lens = np.array([t.n_tokens for t in toks], np.int64)
    offsets = np.r_[0, np.cumsum(lens)]
    tens = dict(feats=torch.from_numpy(np.concatenate([t.feats for t in toks])),
                ts=torch.from_numpy(np.concatenate([t.ts for t in toks])),
                is_target=torch.from_numpy(np.concatenate([t.is_target for t in toks])),
                cross=torch.from_numpy(np.concatenate([t.cross for t in toks])),
                offsets=torch.from_numpy(offsets))
    return Batch("teacher", Targets.cat([t.targets for t in toks]), int(sum(t.n_events for t in toks)), tens)


def collate_student(toks: list[StudentTokens]) -> Batch:
    hl = np.array([t.n_groups for t in toks], np.int64)
    goff = np.r_[0, np.cumsum(hl)[:-1]]
    tens = dict(ev_feats=torch.from_numpy(np.concatenate([t.ev_feats for t in toks])),
                ev_group=torch.from_numpy(np.concatenate([t.ev_group + o for t, o in zip(toks, goff)])),
                hist_ts=torch.from_numpy(np.concatenate([t.hist_ts for t in toks])),
                hist_len=torch.from_numpy(hl),
                cand_feats=torch.from_numpy(np.concatenate([t.cand_feats for t in toks])),
                cand_ts=torch.from_numpy(np.concatenate([t.cand_ts for t in toks])),
                cand_cross=torch.from_numpy(np.concatenate([t.cand_cross for t in toks])),
                cand_len=torch.from_numpy(np.array([len(t.cand_ts) for t in toks], np.int64)),
                ev_len=torch.from_numpy(np.array([t.n_events for t in toks], np.int64)))
    return Batch("student", Targets.cat([t.targets for t in toks]), int(sum(t.n_events for t in toks)), tens)


def collate(toks: list) -> Batch:
    return collate_teacher(toks) if isinstance(toks[0], TeacherTokens) else collate_student(toks)


def without_history(t: StudentTokens) -> StudentTokens:
    """The same candidates with no history tokens (StudentConfig.use_history=False), so no cross counts."""
    F = t.ev_feats.shape[1]
    return replace(t, ev_feats=np.zeros((0, F), np.int64), ev_ts=np.zeros(0, np.int64), ev_group=np.zeros(0, np.int64),
                   hist_ts=np.zeros(0, np.int64), cand_cross=np.zeros_like(t.cand_cross), n_events=0)


def with_candidate_positions(t: StudentTokens, s: Sample, fc: FeatureConfig) -> StudentTokens:
    """Puts each candidate's real position into its F_POS column (StudentConfig.position_input).
    The candidates of student_tokens are the sample's valid targets, the newest ones if cut."""
    n = len(t.cand_ts)
    idx = np.flatnonzero(_valid_targets(s))
    idx = idx[len(idx) - n:]
    assert np.array_equal(s.impression_id[idx], t.targets.impression_id), "candidates are not the sample's targets"
    feats = t.cand_feats.copy()
    feats[:, F_POS] = np.clip(s.position[idx], 0, fc.max_position)
    return replace(t, cand_feats=feats)


def tokenizer_for(kind: str, cfg):
    """Sample -> tokens for a TeacherConfig / StudentConfig, with max_tokens = the budget."""
    fc = cfg.features
    if kind == "teacher":
        return lambda s, budget: teacher_tokens(s, fc, min(cfg.max_len, budget), cfg.mask.delay_ms)

    def student(s: Sample, budget: int) -> StudentTokens:
        t = student_tokens(s, fc, cfg.max_len, cfg.litm, cfg.litm_T, cfg.patm, cfg.patm_bounds, cfg.patm_factors,
                           max_tokens=budget, delay_ms=cfg.mask.delay_ms)
        if not getattr(cfg, "use_history", True):
            t = without_history(t)
        if getattr(cfg, "position_input", False):
            t = with_candidate_positions(t, s, fc)
        return t
    return student


def split_for_ranks(toks: list, world: int) -> list[list]:
    """Deterministic balanced split of a global batch across ranks (largest first, greedy)."""
    parts: list[list] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(toks)), key=lambda i: (-toks[i].n_tokens, i)):
        r = min(range(world), key=lambda r: (load[r], r))
        parts[r].append(i)
        load[r] += toks[i].n_tokens
    return [[toks[i] for i in sorted(p)] for p in parts]


class PackedLoader:
    """Global batches of tokenised samples with at most `token_budget * world` tokens
    (each rank's share <= about token_budget after split_for_ranks). Deterministic per (seed, epoch).
    A sample is cut and split by the global budget, so N ranks of budget B/N read the batches one
    process of budget B reads (models.distributed)."""

    def __init__(self, paths, kind: str, cfg, token_budget: int, seed: int | None = 0, shuffle_buffer: int = 256,
                 teacher_probs=None, world: int = 1, targets_only: bool = True):
        self.paths = list_sample_files(paths)
        self.kind, self.cfg, self.budget = kind, cfg, int(token_budget)
        self.seed, self.shuffle_buffer, self.world = seed, shuffle_buffer, world
        self.teacher = TeacherProbs(teacher_probs) if teacher_probs is not None else None
        self.tok = tokenizer_for(kind, cfg)
        self.targets_only = targets_only
        self.sample_budget = self.budget * world
        # at most half of a sequence's token room goes to targets (a teacher target costs 2 tokens)
        room = min(cfg.max_len, self.sample_budget) if kind == "teacher" else self.sample_budget
        self.max_targets = max(1, room // 4)

    def __iter__(self):
        return self.iter_epoch(0)

    def iter_epoch(self, epoch: int = 0) -> Iterator[list]:
        cap = self.budget * self.world
        cur, used = [], 0
        samples = iter_samples(self.paths, self.cfg.features, self.teacher, self.seed, epoch, self.shuffle_buffer)
        for s in (part for sample in samples for part in split_by_targets(sample, self.max_targets)):
            t = self.tok(s, self.sample_budget)
            if self.targets_only and len(t.targets.label) == 0:
                continue
            if cur and used + t.n_tokens > cap:
                yield cur
                cur, used = [], 0
            cur.append(t)
            used += t.n_tokens
        if cur:
            yield cur


# ----------------------------------------------------------------------------- held-out slice and base rates

def time_holdout(paths, fraction: float, out_dir: str) -> tuple[list[str], list[str]]:
    """Splits training samples by time for early stopping and calibration: the newest day's latest
    ``fraction`` of target impressions (by timestamp; one cut for the whole day, so the slice is out of
    time for every user) become a validation set, and the training set ends before that cut. In the
    validation copy the day's earlier targets stay as ordinary labelled events (the history a server
    would have), exactly as on a next day. Returns (training file list, validation file list), written
    under ``out_dir`` as ``{train,val}/date=D/part-0.parquet``; the older days' files are used as they are."""
    files = list_sample_files(paths)
    if not files:
        raise ValueError(f"time_holdout: no training samples under {paths}")
    newest = max(_date_of(f) or "" for f in files)  # files outside a date=D folder count as one (newest) day
    df = pd.concat([pd.read_parquet(f) for f in files if (_date_of(f) or "") == newest], ignore_index=True)
    target = df["is_target"].fillna(False).to_numpy(bool) & (df["event_kind"] == "impression").to_numpy()
    if not target.any():
        raise ValueError(f"time_holdout: the newest day {newest} has no target impressions to hold out")
    cut = int(np.quantile(df.loc[target, "ts_ms"].to_numpy(), 1.0 - fraction, method="higher"))
    late = df["ts_ms"].to_numpy() >= cut
    val = df.assign(is_target=target & late)
    val = val[val.groupby("user_id")["is_target"].transform("any")]
    out = {}
    for name, part in (("train", df[~late]), ("val", val)):
        folder = os.path.join(out_dir, name, f"date={newest}" if newest else "undated")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "part-0.parquet")
        part.to_parquet(path, index=False)
        out[name] = path
    return [f for f in files if (_date_of(f) or "") != newest] + [out["train"]], [out["val"]]


def observed_ctr(paths, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(clicks, impressions) per model bucket (position_bucket clipped to n_buckets - 1) over the labelled
    target impressions of the samples: the base rate the heads start from (models.train.fit)."""
    clicks, shown = np.zeros(n_buckets), np.zeros(n_buckets)
    for f in list_sample_files(paths):
        t = pq.read_table(f, columns=["is_target", "event_kind", "label", "position_bucket"]).to_pandas()
        t = t[t["is_target"].fillna(False).astype(bool) & (t["event_kind"] == "impression") & t["label"].notna()]
        b = np.clip(t["position_bucket"].fillna(0).to_numpy(np.int64), 0, n_buckets - 1)
        np.add.at(clicks, b, t["label"].to_numpy(np.float64))
        np.add.at(shown, b, 1.0)
    return clicks, shown
