"""The online sequence store: user id -> the user's newest ``max_events`` events, as of one published day.

The ``online_sequences`` asset feeds it every day from ``lake/user_sequences/date=D`` (only the users
active on D are rewritten) and the scoring service reads one user per request; nothing here loads the
lake at serving time, so the service's memory does not grow with days or users.

Two backends behind one interface, chosen by ``GENRANK_ONLINE_STORE`` (``open_store``):

- **LMDB** (default, embedded, ``$GENRANK_HOME/online_store/``). Chosen over SQLite and RocksDB because
  the service runs several worker processes that all read while the pipeline writes: LMDB readers are
  lock-free MVCC snapshots over one shared memory map (every worker shares the same page cache, and a
  read is a B-tree walk with no copy until decoding), and a write transaction of any size commits
  atomically, so a day's update is published as a whole. SQLite serialises readers behind its WAL
  checkpoints and copies every row; RocksDB allows one read-write process and needs secondary instances
  that catch up by polling.
- **Redis** (``redis://host:port/db``), for a fleet of serving hosts. Each user is a hash whose fields
  are days (the newest state and the one before it); a published day is the ``meta`` key's ``as_of``,
  set after every user of the day is written, and a reader picks the newest field not after it in the
  same server-side script that reads ``meta``. A writer that dies half-way leaves ``as_of`` where it was.

Either way a reader sees day D-1 or day D, never a mix; the meta record carries the format version,
the hash key the ids were hashed with and ``max_events``.

Beside the users, the same publication holds the item statistics the run of D computed for the requests after
it (``published_items``, contracts.ITEM_STAT_COLUMNS): one record per ad and per campaign, read by
``item_stats`` for a request's candidates. LMDB replaces them in the day's write transaction; Redis keeps them in
one hash per published day (the day before stays for readers still on it), read with the meta in one script.
An id without a record scores with zero counts (models.data.item_stat_features' prior) and is counted.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow.dataset as ds

from contracts import ITEM_STAT_COLUMNS, ITEM_STAT_LEVELS, layout
from deploy.event_codec import EventArrays, concat, encode, from_bytes, to_bytes

FORMAT_VERSION = 1
LAKE_COLUMNS = ["user_id", "seq_index", "ts_ms", "event_kind", "item_id", "campaign_id", "advertiser_id",
                "category_id", "brand_id", "position", "surface", "device", "action", "label", "click_type",
                "dwell_ms"]
LMDB_MAP_SIZE = 1 << 40  # address space only: the file grows with what is written
# item_windows' count columns (impressions_7d, clicks_7d, ...): one level's ITEM_STAT_COLUMNS without the level
ITEM_WINDOW_COUNTS = tuple(c.split("_", 1)[1] for c in ITEM_STAT_COLUMNS[:len(ITEM_STAT_COLUMNS) // len(ITEM_STAT_LEVELS)])
_ITEM_RECORD = np.dtype(f"<{len(ITEM_WINDOW_COUNTS)}i8")   # one level's counts, in that order


class StoreUnavailable(RuntimeError):
    """The store cannot answer (missing, half-written, another format): the service answers 503 with this."""


@dataclass(frozen=True)
class StoreMeta:
    as_of: str
    format_version: int
    hash_key: str
    max_events: int
    users: int
    published_at: float
    item_records: int = 0   # item-statistics records (ads and campaigns) published with the day

    @staticmethod
    def parse(raw: bytes | None, where: str) -> "StoreMeta":
        if raw is None:
            raise StoreUnavailable(f"the online store at {where} has no published day (never built, or its first "
                                   "build did not finish): materialise online_sequences")
        try:
            meta = StoreMeta(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise StoreUnavailable(f"the online store at {where} has an unreadable meta record ({exc})") from exc
        if meta.format_version != FORMAT_VERSION:
            raise StoreUnavailable(f"the online store at {where} is format version {meta.format_version}; this "
                                   f"service reads version {FORMAT_VERSION}: rebuild it with online_sequences")
        return meta

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()


@dataclass
class PublishReport:
    day: str
    mode: str            # "incremental" (users active on D merged into D-1's state) or "rebuild" (from the lake)
    users_written: int
    new_users: int
    events_read: int
    users: int
    seconds: float
    item_records: int    # item-statistics records published for the requests after the day


class OnlineStore:
    """The interface both backends implement; ``lookup`` is the serving read, ``publish`` the daily write."""

    where: str

    def meta(self) -> StoreMeta:
        """The published day's meta record (StoreUnavailable if there is none or it is unreadable)."""
        return StoreMeta.parse(self._read_meta(), self.where)

    def lookup(self, user_id: str) -> tuple[StoreMeta, EventArrays | None]:
        """The user's events and the day they are as of, read from one snapshot; None for an unknown user."""
        raw_meta, blob = self._read_user(user_id)
        return StoreMeta.parse(raw_meta, self.where), (from_bytes(blob) if blob else None)

    def refresh(self) -> StoreMeta:
        """The published day, after checking the store is still the one this process reads."""
        return self.meta()

    def item_stats(self, ad_ids: list, campaign_ids: list) -> tuple[np.ndarray, int]:
        """``candidate_item_stats`` as of the published day."""
        return candidate_item_stats(self._read_items, ad_ids, campaign_ids)

    def publish(self, day: str, users: Iterable[tuple[str, EventArrays]], *, rebuild: bool, max_events: int,
                hash_key: str, items: dict[bytes, bytes] | None = None) -> tuple[int, int]:
        """Write every (user, events of the day) as that user's newest ``max_events`` events (merged into the
        state before ``day`` unless ``rebuild``, which starts from nothing) and the day's item-statistics
        records ``items`` (``published_items``; they replace the day before's), then publish ``day`` as one step. Returns
        (users written, users new to the store)."""
        raise NotImplementedError

    def _read_meta(self) -> bytes | None:
        raise NotImplementedError

    def _read_user(self, user_id: str) -> tuple[bytes | None, bytes | None]:
        raise NotImplementedError

    def _read_items(self, keys: list[bytes]) -> list[bytes | None]:
        """The records of ``keys`` as of the published day (None: no record)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def _user_key(user_id: str) -> bytes:
    return b"u:" + user_id.encode()


def _item_key(level: str, key) -> bytes | None:
    return None if key is None or key != key else f"s:{level}:{key}".encode()


def candidate_item_stats(read: Callable[[list[bytes]], list[bytes | None]], ad_ids: list,
                         campaign_ids: list) -> tuple[np.ndarray, int]:
    """Candidates' item statistics, (n, len(ITEM_STAT_COLUMNS)) float32 in the contract's order, from the records
    ``read`` returns for their keys, and how many candidates had no ad record (their ad's counts are zero)."""
    keys = [_item_key(level, key) for level, ids in zip(ITEM_STAT_LEVELS, (ad_ids, campaign_ids)) for key in ids]
    unique = list(dict.fromkeys(k for k in keys if k is not None))
    found = dict(zip(unique, read(unique))) if unique else {}
    out = np.zeros((len(keys), len(ITEM_WINDOW_COUNTS)), np.float32)
    for i, key in enumerate(keys):
        if found.get(key) is not None:
            out[i] = np.frombuffer(found[key], _ITEM_RECORD)[0]
    n = len(ad_ids)
    return np.concatenate([out[:n], out[n:]], 1), sum(found.get(key) is None for key in keys[:n])


def published_items(lake: Path, day: str) -> dict[bytes, bytes]:
    """The item-statistics records the store publishes with ``day`` (lake/item_windows/date=D+1, for the requests
    after the run of D) as ``_item_key`` -> one level's counts; empty if the sequence build has not exported
    them (a lake built before the item statistics existed)."""
    following = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
    files = sorted(layout.day_dir(Path(lake) / layout.ITEM_WINDOWS, following).glob("*.parquet"))
    if not files:
        return {}
    table = ds.dataset([str(f) for f in files], format="parquet").to_table()
    counts = np.stack([table.column(name).to_numpy() for name in ITEM_WINDOW_COUNTS], 1)
    return item_records(table.column("level").to_pylist(), table.column("key").to_pylist(), counts)


def item_records(levels: list[str], keys: list, counts: np.ndarray) -> dict[bytes, bytes]:
    """Store records of item statistics: (level, key) -> that level's counts (n, ITEM_WINDOW_COUNTS)."""
    counts = np.asarray(counts, np.int64)
    return {_item_key(level, key): counts[i].astype(_ITEM_RECORD.base).tobytes()
            for i, (level, key) in enumerate(zip(levels, keys))}


# ------------------------------------------------------------------------------------------ LMDB

class LmdbStore(OnlineStore):
    META = b"meta"

    def __init__(self, path: Path, readonly: bool = True):
        self.path, self.readonly, self.where = Path(path), readonly, str(path)
        self._env, self._identity = self._open()

    def _open(self):
        import lmdb

        data = self.path / "data.mdb"
        if self.readonly and not data.exists():
            raise StoreUnavailable(f"no online store at {self.path}: materialise online_sequences")
        if not self.readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            env = lmdb.open(str(self.path), map_size=LMDB_MAP_SIZE, readonly=self.readonly, max_readers=512,
                            readahead=False, meminit=False)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"the online store at {self.path} cannot be opened (half-written or corrupt?): "
                                   f"{type(exc).__name__}: {exc}") from exc
        stat = data.stat()
        return env, (stat.st_dev, stat.st_ino)

    def refresh(self) -> StoreMeta:
        """The published day. The pipeline updates the store in place; files removed or replaced under an open
        store (LMDB allows one open per path and process) leave this process serving the copy it opened."""
        try:
            stat = (self.path / "data.mdb").stat()
            replaced = (stat.st_dev, stat.st_ino) != self._identity
        except FileNotFoundError:
            replaced = True
        if replaced:
            raise StoreUnavailable(f"the online store at {self.path} was removed or replaced since this process "
                                   "opened it: still serving the copy it opened; restart the service to open the new one")
        return self.meta()

    def _read_meta(self) -> bytes | None:
        with self._env.begin() as txn:
            return txn.get(self.META)

    def _read_user(self, user_id: str):
        with self._env.begin() as txn:  # one snapshot: the meta and the user agree on the day
            return txn.get(self.META), txn.get(_user_key(user_id))

    def _read_items(self, keys):
        with self._env.begin() as txn:
            return [txn.get(k) for k in keys]

    def publish(self, day, users, *, rebuild, max_events, hash_key, items=None):
        written = new = 0
        items = items or {}
        with self._env.begin(write=True) as txn:  # one write transaction: readers see all of it or none
            db = self._env.open_db(txn=txn)
            before = None if rebuild else txn.get(self.META)
            n_before = StoreMeta.parse(before, self.where).users if before else 0
            if rebuild:
                txn.drop(db, delete=False)
            else:
                with txn.cursor() as cursor:   # the day before's item statistics: an id no longer counted goes
                    while cursor.set_range(b"s:") and cursor.key().startswith(b"s:"):
                        cursor.delete()
            for key, record in items.items():
                txn.put(key, record)
            for user, events in users:
                key = _user_key(user)
                old = txn.get(key)
                new += old is None
                merged = events if old is None else concat(from_bytes(old), events)
                txn.put(key, to_bytes(merged.newest(max_events)))
                written += 1
            txn.put(self.META, StoreMeta(day, FORMAT_VERSION, hash_key, max_events, n_before + new,
                                         time.time(), len(items)).encode())
        return written, new

    def close(self) -> None:
        self._env.close()


# ------------------------------------------------------------------------------------------ Redis

# The newest field of a user's hash that is not after the bound (ISO days sort as strings).
_NEWEST_UPTO = """
local best = nil
for _, d in ipairs(redis.call('HKEYS', KEYS[2])) do
  if d <= bound and (best == nil or d > best) then best = d end
end
if best == nil then return {meta, ''} end
return {meta, redis.call('HGET', KEYS[2], best)}
"""
_READ = """
local meta = redis.call('GET', KEYS[1])
if not meta then return {'', ''} end
local bound = cjson.decode(meta)['as_of']
""" + _NEWEST_UPTO
_READ_UPTO = "local meta = ''\nlocal bound = ARGV[1]\n" + _NEWEST_UPTO
# The published day's item records: KEYS[2] is the prefix of the per-day hashes.
_READ_ITEMS = """
local meta = redis.call('GET', KEYS[1])
if not meta then return {} end
return redis.call('HMGET', KEYS[2] .. cjson.decode(meta)['as_of'], unpack(ARGV))
"""
# Write day ARGV[1]; keep only it and the newest older day (what readers still on the previous day read).
_WRITE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local prev = nil
local days = redis.call('HKEYS', KEYS[1])
for _, d in ipairs(days) do
  if d < ARGV[1] and (prev == nil or d > prev) then prev = d end
end
for _, d in ipairs(days) do
  if d ~= ARGV[1] and d ~= prev then redis.call('HDEL', KEYS[1], d) end
end
return 1
"""


class RedisStore(OnlineStore):
    BATCH = 256  # users per pipelined round trip when publishing

    def __init__(self, url: str, prefix: str = "genrank:seq"):
        import redis

        self.where, self.prefix = url, prefix
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self._read = self.client.register_script(_READ)
        self._read_upto = self.client.register_script(_READ_UPTO)
        self._write = self.client.register_script(_WRITE)
        self._read_items_script = self.client.register_script(_READ_ITEMS)
        self.meta_key = f"{prefix}:meta"
        self.items_prefix = f"{prefix}:items:"

    def _key(self, user_id: str) -> bytes:
        return f"{self.prefix}:".encode() + _user_key(user_id)

    def _read_meta(self):
        import redis

        try:
            return self.client.get(self.meta_key)
        except redis.RedisError as exc:
            raise StoreUnavailable(f"the online store at {self.where} does not answer: {exc}") from exc

    def _read_user(self, user_id):
        import redis

        try:
            meta, blob = self._read(keys=[self.meta_key, self._key(user_id)])
        except redis.RedisError as exc:
            raise StoreUnavailable(f"the online store at {self.where} does not answer: {exc}") from exc
        return meta or None, blob or None

    def _read_items(self, keys):
        import redis

        try:
            return [v or None for v in self._read_items_script(keys=[self.meta_key, self.items_prefix], args=keys)]
        except redis.RedisError as exc:
            raise StoreUnavailable(f"the online store at {self.where} does not answer: {exc}") from exc

    def _publish_items(self, day: str, items: dict[bytes, bytes]) -> None:
        """The day's item records as one hash, written before the meta names the day; every older hash but
        the newest one before it (still read by workers on the previous day) is deleted."""
        key = self.items_prefix + day
        self.client.delete(key)
        records = list(items.items())
        for first in range(0, len(records), 1000):
            self.client.hset(key, mapping=dict(records[first:first + 1000]))
        older = sorted(k.decode() for k in self.client.scan_iter(match=self.items_prefix + "*")
                       if k.decode() < key)
        if len(older) > 1:
            self.client.delete(*older[:-1])

    def publish(self, day, users, *, rebuild, max_events, hash_key, items=None):
        items = items or {}
        self._publish_items(day, items)
        before = self.client.get(self.meta_key)
        n_before = 0 if rebuild or before is None else StoreMeta.parse(before, self.where).users
        # The state before `day`: none on a rebuild, else the newest field before it (D-1 on a rerun of D).
        bound = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
        written = new = 0
        for batch in _batches(users, self.BATCH):
            pipe = self.client.pipeline(transaction=False)
            if not rebuild:
                for user, _ in batch:
                    self._read_upto(keys=["", self._key(user)], args=[bound], client=pipe)
                olds = [blob or None for _, blob in pipe.execute()]
            else:
                olds = [None] * len(batch)
            for (user, events), old in zip(batch, olds):
                new += old is None
                merged = events if old is None else concat(from_bytes(old), events)
                self._write(keys=[self._key(user)], args=[day, to_bytes(merged.newest(max_events))], client=pipe)
            pipe.execute()
            written += len(batch)
        self.client.set(self.meta_key, StoreMeta(day, FORMAT_VERSION, hash_key, max_events, n_before + new,
                                                 time.time(), len(items)).encode())
        return written, new

    def close(self) -> None:
        self.client.close()


def _batches(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def open_store(setting: str, home: Path, readonly: bool = True) -> OnlineStore:
    """``setting`` is GENRANK_ONLINE_STORE: empty for the embedded LMDB store under ``home``, else a redis:// URL."""
    if setting.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(setting)
    if setting:
        raise ValueError(f"GENRANK_ONLINE_STORE={setting!r}: leave it empty (embedded LMDB) or give a redis:// URL")
    return LmdbStore(Path(home) / "online_store", readonly=readonly)


# ------------------------------------------------------------------------------------------ the daily update

def _lake_users(files: list[str], hash_key: str) -> Iterator[tuple[str, EventArrays]]:
    """Every user's events in ``files`` (user_sequences partitions), oldest first, one user at a time."""
    if not files:
        return
    table = ds.dataset(files, format="parquet").to_table(columns=LAKE_COLUMNS).sort_by(
        [("user_id", "ascending"), ("seq_index", "ascending")])
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in LAKE_COLUMNS}
    events = encode(cols, hash_key)
    users = cols["user_id"].astype(str)
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]]) if len(users) else np.zeros(0, int)
    for a, b in zip(starts, np.r_[starts[1:], len(users)]):
        yield str(users[a]), events.take(slice(a, b))


def partition_files(lake: Path, days: list[str]) -> list[str]:
    return [str(f) for d in days for f in sorted(layout.day_dir(Path(lake) / layout.USER_SEQUENCES, d).glob("*.parquet"))]


def update_day(store: OnlineStore, lake: Path, day: str, max_events: int, hash_key: str) -> PublishReport:
    """Publish ``day``: incrementally (only D's users, merged into D-1's state) when the store is at D-1,
    else rebuilt from every user_sequences partition up to D (first build, a rerun, a gap, another format),
    with the item statistics the run of D exported for the requests after it (lake/item_windows/date=D+1)."""
    started = time.perf_counter()
    previous = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
    try:
        meta = store.meta()
        incremental = (meta.as_of == previous and meta.max_events == max_events and meta.hash_key == hash_key)
    except StoreUnavailable:
        incremental = False
    root = Path(lake) / layout.USER_SEQUENCES
    if not layout.day_dir(root, day).is_dir():
        raise ValueError(f"no user_sequences partition for {day} under {root}: build the sequences first")
    days = [day] if incremental else [d for d in layout.days_in(root) if d <= day]
    files = partition_files(lake, days)
    counted = {"events": 0}

    def users():
        for user, events in _lake_users(files, hash_key):
            counted["events"] += len(events)
            yield user, events

    items = published_items(lake, day)
    written, new = store.publish(day, users(), rebuild=not incremental, max_events=max_events, hash_key=hash_key,
                                 items=items)
    return PublishReport(day, "incremental" if incremental else "rebuild", written, new, counted["events"],
                         store.meta().users, time.perf_counter() - started, len(items))

