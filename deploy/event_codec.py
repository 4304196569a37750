"""A user's events as compact numpy columns: what the online store holds and what a request becomes.

The store keeps, per event, the 64-bit hash of each id (``models.data.stable_hash`` under the
features' hash key) instead of the string, and the outcome fields already coded as the tokeniser
codes them. A model maps the hashes to its own vocabularies at request time (``hash_ids``'s
``1 + h % (size - 1)``), so the store does not depend on any model's table sizes, and a request is
prepared with numpy alone: no DataFrame, no Arrow table, no string per event.

Serialised form (``to_bytes``): a fixed header (magic, format version, events, distinct hashes, code
width) then one zlib stream of the columns; the ids become codes into the user's distinct hashes and
the times deltas, so 1,024 events take ~15-25 KB instead of ~80 KB.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from contracts import ITEM_STAT_COLUMNS
from models.config import FeatureConfig
from models.data import (A_CLICK, A_NOCLICK, ACTION_IDS, CLICK_TYPE_IDS, HASHED, SAMPLE_ARRAYS, Sample,
                         stable_hash)

ID_COLUMNS = tuple(column for column, _ in HASHED)  # the order of Sample.ids' columns
CODEC_VERSION = 1
_HEADER = struct.Struct("<4sHIIB")
_MAGIC = b"GRSQ"


@dataclass
class EventArrays:
    """Events oldest first; hash 0 stands for a null id (a real id hashes to 0 with probability 2^-64)."""

    ts: np.ndarray        # int64 ms
    hashes: np.ndarray    # uint64 (n, 7), ID_COLUMNS
    is_imp: np.ndarray    # bool
    action: np.ndarray    # int8: ACTION_IDS for behaviours, A_CLICK / A_NOCLICK for impressions
    label: np.ndarray     # int8, -1 = null
    click_type: np.ndarray  # int8, CLICK_TYPE_IDS, 0 = null
    position: np.ndarray  # int32, 0 = null
    dwell_ms: np.ndarray  # float64, nan = null

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    def take(self, idx) -> "EventArrays":
        return EventArrays(**{f: getattr(self, f)[idx] for f in _FIELDS})

    def newest(self, n: int) -> "EventArrays":
        return self if len(self) <= n else self.take(slice(len(self) - n, None))


_FIELDS = tuple(EventArrays.__dataclass_fields__)


def concat(old: EventArrays | None, new: EventArrays) -> EventArrays:
    if old is None:
        return new
    return EventArrays(**{f: np.concatenate([getattr(old, f), getattr(new, f)]) for f in _FIELDS})


def _coded(values: np.ndarray, codes: Mapping[str, int]) -> np.ndarray:
    return np.fromiter((codes.get(v, 0) if isinstance(v, str) else 0 for v in values), np.int8, len(values))


def _nullable(values: np.ndarray, null, dtype) -> np.ndarray:
    return np.array([null if v is None or v != v else v for v in values], dtype)


def hash_columns(columns: Mapping[str, np.ndarray], hash_key: str) -> np.ndarray:
    """(n, 7) uint64 hashes of the id columns (a missing column or a null id hashes to 0). The columns are
    hashed in one call: per-call overhead, not the strings, dominates a request's 200 candidates."""
    n = len(next(iter(columns.values())))
    values = np.concatenate([np.asarray(columns.get(name, np.full(n, None)), dtype=object) for name in ID_COLUMNS])
    if not n:
        return np.zeros((0, len(ID_COLUMNS)), np.uint64)
    hashed = np.where(pd.isna(values), np.uint64(0), stable_hash(values, hash_key))
    return hashed.reshape(len(ID_COLUMNS), n).T.copy()


def encode(columns: Mapping[str, np.ndarray], hash_key: str) -> EventArrays:
    """Events given as columns (the user_sequences fields; object arrays, None = null), in the order given."""
    kind = np.asarray(columns["event_kind"], dtype=object)
    is_imp = kind == "impression"
    label = _nullable(columns.get("label", [None] * len(kind)), -1, np.int8)
    action = np.where(is_imp, np.where(label == 1, A_CLICK, A_NOCLICK),
                      _coded(np.asarray(columns.get("action", [None] * len(kind)), object), ACTION_IDS)).astype(np.int8)
    return EventArrays(
        ts=np.asarray(columns["ts_ms"], np.int64), hashes=hash_columns(columns, hash_key), is_imp=is_imp,
        action=action, label=label,
        click_type=_coded(np.asarray(columns.get("click_type", [None] * len(kind)), object), CLICK_TYPE_IDS),
        position=_nullable(columns.get("position", [None] * len(kind)), 0, np.int32),
        dwell_ms=_nullable(columns.get("dwell_ms", [None] * len(kind)), np.nan, np.float64))


def to_sample(events: EventArrays, features: FeatureConfig) -> Sample:
    """The Sample ``models.data.sample_from_frame`` builds from the same events (hashed for ``features``)."""
    if len(events) > 1 and (np.diff(events.ts) < 0).any():  # the tokeniser's order: by time, stable
        events = events.take(np.argsort(events.ts, kind="stable"))
    sizes = features.table_sizes()
    h = events.hashes
    ids = np.empty(h.shape, np.int64)
    for j, (_, size_name) in enumerate(HASHED):
        col = h[:, j]
        ids[:, j] = np.where(col == 0, 0, 1 + col % np.uint64(max(1, sizes[size_name] - 1)))
    n = len(events)
    arrays = dict(ts=events.ts, is_target=np.zeros(n, bool), is_imp=events.is_imp, ids=ids, item_key=h[:, 0],
                  action=events.action.astype(np.int64), position=events.position.astype(np.int64),
                  bucket=np.full(n, -1, np.int64), label=events.label.astype(np.int64),
                  click_type=events.click_type.astype(np.int64), dwell_ms=events.dwell_ms,
                  impression_id=np.full(n, None, object), teacher_p=np.full(n, np.nan, np.float32),
                  item_stats=np.zeros((n, len(ITEM_STAT_COLUMNS)), np.float32))
    assert set(arrays) == set(SAMPLE_ARRAYS)
    return Sample(user_id="", date="", **arrays)


def to_bytes(events: EventArrays) -> bytes:
    uniq, codes = np.unique(events.hashes.ravel(), return_inverse=True)
    code_t = np.uint16 if len(uniq) <= np.iinfo(np.uint16).max else np.uint32
    ts = np.diff(events.ts, prepend=np.int64(0))
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in (
        ts, uniq, codes.astype(code_t), events.is_imp, events.action, events.label, events.click_type,
        events.position, events.dwell_ms))
    return _HEADER.pack(_MAGIC, CODEC_VERSION, len(events), len(uniq), np.dtype(code_t).itemsize) + zlib.compress(body, 1)


def from_bytes(blob: bytes) -> EventArrays:
    magic, version, n, k, code_size = _HEADER.unpack_from(blob)
    if magic != _MAGIC or version != CODEC_VERSION:
        raise ValueError(f"not a genrank event record of codec version {CODEC_VERSION} (magic {magic!r}, version {version})")
    body = zlib.decompress(memoryview(blob)[_HEADER.size:])
    layout = [("ts", np.int64, n), ("uniq", np.uint64, k), ("codes", np.dtype(f"u{code_size}"), n * len(ID_COLUMNS)),
              ("is_imp", np.bool_, n), ("action", np.int8, n), ("label", np.int8, n), ("click_type", np.int8, n),
              ("position", np.int32, n), ("dwell_ms", np.float64, n)]
    cols, offset = {}, 0
    for name, dtype, count in layout:
        cols[name] = np.frombuffer(body, dtype, count, offset)
        offset += np.dtype(dtype).itemsize * count
    return EventArrays(ts=np.cumsum(cols["ts"]), hashes=cols["uniq"][cols["codes"]].reshape(n, len(ID_COLUMNS)),
                       is_imp=cols["is_imp"], action=cols["action"], label=cols["label"],
                       click_type=cols["click_type"], position=cols["position"], dwell_ms=cols["dwell_ms"])
