"""Reading and hashing: the `training_samples` contract as per-user Samples.

Reading (`iter_samples`): one row per event, rows contiguous per user, sorted by (user_id, ts_ms,
event_rank), one file set per day `date=D`. Files are streamed one Parquet row group at a time; the rows of
the last user of a row group are carried over to the next, so memory is bounded by one row group (+ the
shuffle buffer), whatever the number of days. One sample = one (user, day D).

Hashing (`hash_ids`): stable, vectorised (pandas.util.hash_array with a fixed 16-byte key, never Python's
salted hash()); id -> 1 + h % (size - 1); null -> 0.

Also here: the held-out slice by time (`time_holdout`) and the observed base rates (`observed_ctr`) that
training reads from the same files.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contracts import ACTIONS, CLICK_TYPES, ITEM_STAT_COLUMNS, TRAINING_SAMPLES, layout

from ..config import FeatureConfig

# action vocabulary: organic actions 1..4; impression outcome 5 (no click) / 6 (click)
ACTION_IDS = {action: i for i, action in enumerate(ACTIONS, start=1)}
A_NOCLICK, A_CLICK = len(ACTIONS) + 1, len(ACTIONS) + 2
CLICK_TYPE_IDS = {click_type: i for i, click_type in enumerate(CLICK_TYPES, start=1)}

# the contract's columns less the two the models never read (the row order is the rank; the day is the partition)
READ_COLUMNS = [c for c in TRAINING_SAMPLES if c not in ("event_rank", "event_date")]
HASHED = [("item_id", "item_buckets"), ("campaign_id", "campaign_buckets"), ("advertiser_id", "advertiser_buckets"),
          ("category_id", "category_buckets"), ("brand_id", "brand_buckets"), ("surface", "surface_buckets"),
          ("device", "device_buckets")]


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
    item_stats: np.ndarray   # (E, len(ITEM_STAT_COLUMNS)) float32 counts, 0 where null (non-target rows)

    @property
    def n_events(self) -> int:
        return int(self.ts.shape[0])


SAMPLE_ARRAYS = ("ts", "is_target", "is_imp", "ids", "item_key", "action", "position", "bucket", "label",
                 "click_type", "dwell_ms", "impression_id", "teacher_p", "item_stats")


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


def date_of(path: str) -> str | None:
    m = re.search(r"date=(\d{4}-\d{2}-\d{2})", path)
    return m.group(1) if m else None


def _col(tbl: pa.Table, name: str) -> np.ndarray:
    return tbl.column(name).to_numpy(zero_copy_only=False)


def _num(tbl: pa.Table, name: str, fill, dtype) -> np.ndarray:
    c = tbl.column(name)
    return c.fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype) if c.null_count else c.to_numpy(zero_copy_only=False).astype(dtype)


def encode_table(tbl: pa.Table, fc: FeatureConfig) -> dict[str, np.ndarray]:
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
    # partitions built before the item statistics existed read as zero counts
    stats = np.stack([_num(tbl, c, 0, np.float32) if c in tbl.column_names else np.zeros(tbl.num_rows, np.float32)
                      for c in ITEM_STAT_COLUMNS], 1)
    return dict(
        user_id=_col(tbl, "user_id"), ts=_num(tbl, "ts_ms", 0, np.int64), is_target=_num(tbl, "is_target", False, bool),
        is_imp=is_imp, ids=ids, item_key=stable_hash(item, fc.hash_key), action=action,
        position=_num(tbl, "position", 0, np.int64), bucket=_num(tbl, "position_bucket", -1, np.int64),
        label=label, click_type=ctype, dwell_ms=dwell, impression_id=_col(tbl, "impression_id"), item_stats=stats)


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


def make_sample(d: dict, date: str, teacher: TeacherProbs | None) -> Sample:
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
                  impression_id=d["impression_id"], teacher_p=tp, item_stats=d["item_stats"])


def iter_file_samples(path: str, fc: FeatureConfig, teacher: TeacherProbs | None = None) -> Iterator[Sample]:
    """Streams one Parquet file row group by row group, yielding one Sample per user."""
    pf = pq.ParquetFile(path)
    cols = [c for c in READ_COLUMNS if c in pf.schema_arrow.names]
    date = date_of(path) or ""
    carry = None
    for rg in range(pf.num_row_groups):
        tbl = pf.read_row_group(rg, columns=cols)
        if tbl.num_rows == 0:
            continue
        d = _concat(carry, encode_table(tbl, fc))
        users = d["user_id"]
        starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
        bounds = np.r_[starts, len(users)]
        for a, b in zip(bounds[:-2], bounds[1:-1]):
            yield make_sample(_slice(d, a, b), date, teacher)
        carry = _slice(d, bounds[-2], bounds[-1])
    if carry is not None and len(carry["ts"]):
        yield make_sample(carry, date, teacher)


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
    newest = max(date_of(f) or "" for f in files)  # files outside a date=D folder count as one (newest) day
    day = [pq.ParquetFile(f) for f in files if (date_of(f) or "") == newest]
    # A source row group at a time, in Arrow: a `large` day (1.2 M event rows, eleven string columns) took
    # 1.2 GB as one DataFrame of Python strings, the largest part of a daily student's peak. The split needs
    # only four columns of the whole day; the copies keep the source's column types and row groups.
    keys = pa.concat_tables([pf.read(columns=["user_id", "ts_ms", "is_target", "event_kind"]) for pf in day],
                            promote_options="default")
    target = (pc.fill_null(keys["is_target"], False).to_numpy()
              & pc.equal(keys["event_kind"], "impression").to_numpy(zero_copy_only=False))
    if not target.any():
        raise ValueError(f"time_holdout: the newest day {newest} has no target impressions to hold out")
    ts = keys["ts_ms"].to_numpy()
    cut = int(np.quantile(ts[target], 1.0 - fraction, method="higher"))
    late = ts >= cut
    held_out = target & late
    users = pc.unique(keys["user_id"].filter(pa.array(held_out)))
    schema = pa.unify_schemas([pf.schema_arrow for pf in day], promote_options="default")
    out, writers = {}, {}
    for name in ("train", "val"):
        folder = str(layout.day_dir(os.path.join(out_dir, name), newest)) if newest else os.path.join(out_dir, name, "undated")
        os.makedirs(folder, exist_ok=True)
        out[name] = os.path.join(folder, "part-0.parquet")
        writers[name] = pq.ParquetWriter(out[name], schema)
    with writers["train"], writers["val"]:
        row = 0
        for pf in day:
            for i in range(pf.num_row_groups):
                part = _conform(pf.read_row_group(i), schema)
                rows = slice(row, row + part.num_rows)
                row += part.num_rows
                writers["train"].write_table(part.filter(pa.array(~late[rows])))
                val = part.set_column(schema.get_field_index("is_target"), schema.field("is_target"),
                                      pa.array(held_out[rows], schema.field("is_target").type))
                writers["val"].write_table(val.filter(pc.is_in(val["user_id"], value_set=users)))
    return [f for f in files if (date_of(f) or "") != newest] + [out["train"]], [out["val"]]


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order and types; a column it lacks is null."""
    cols = [table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


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
