"""The online sequence store, embedded (LMDB) and on a real redis-server: the daily update rewrites only
the day's users and equals the lake's newest events, a reader sees day D-1 or D and never a mix, the item
statistics published with a day are the lake's and replace the day before's, and a missing, half-written or
foreign store says why."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from contracts import ITEM_STAT_COLUMNS
from deploy.event_codec import encode, to_sample
from deploy.sequence_store import (FORMAT_VERSION, ITEM_WINDOW_COUNTS, LmdbStore, RedisStore, StoreUnavailable,
                                   open_store, partition_files, update_day)
from models.config import FeatureConfig
from models.data import SAMPLE_ARRAYS, sample_from_frame

KEY = FeatureConfig().hash_key
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
MAX_EVENTS = 7


def _write_lake(lake, seed=0):
    """Three days of user_sequences partitions: users u0..u5, each active on some days only."""
    rng = np.random.default_rng(seed)
    heads = {}
    for d, day in enumerate(DAYS):
        rows = []
        for u in [u for u in range(6) if (u + d) % 3 != 0]:
            n = int(rng.integers(1, 6))
            start = heads.get(u, 0)
            heads[u] = start + n
            base = 1_767_225_600_000 + d * 86_400_000
            for i in range(n):
                imp = bool(rng.random() < 0.6)
                rows.append({"user_id": f"u{u}", "seq_index": start + i + 1, "ts_ms": base + 1000 * (start + i),
                             "event_kind": "impression" if imp else "behavior", "request_id": None,
                             "impression_id": None, "item_id": f"i{rng.integers(9)}", "campaign_id": f"c{u}",
                             "advertiser_id": None, "category_id": f"k{rng.integers(3)}", "brand_id": "b1",
                             "position": int(rng.integers(1, 5)) if imp else None, "surface": "feed",
                             "device": "ios", "action": None if imp else "cart",
                             "label": int(rng.random() < 0.3) if imp else None, "click_type": None,
                             "dwell_ms": 2500.0 if imp else None})
        part = lake / "user_sequences" / f"date={day}"
        part.mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(part / "part-0.parquet")


def _expected(lake, upto: str) -> dict[str, pd.DataFrame]:
    seqs = pd.concat(pd.read_parquet(f) for f in partition_files(lake, [d for d in DAYS if d <= upto]))
    seqs = seqs.sort_values(["user_id", "seq_index"])
    return {u: g.tail(MAX_EVENTS) for u, g in seqs.groupby("user_id")}


def _same(events, frame) -> bool:
    fc = FeatureConfig()
    a, b = to_sample(events, fc), sample_from_frame(frame, fc)
    return all(np.array_equal(getattr(a, f), getattr(b, f), equal_nan=getattr(a, f).dtype.kind == "f")
               for f in SAMPLE_ARRAYS if f != "impression_id")


@pytest.fixture(params=["lmdb", "redis"])
def store(request, tmp_path):
    if request.param == "lmdb":
        s = open_store("", tmp_path, readonly=False)
    else:
        s = RedisStore(request.getfixturevalue("redis_url"), prefix=f"test:{tmp_path.name}")
        s.BATCH = 2  # several round trips per day, so a reader can look between them
    yield s
    s.close()


def test_the_daily_update_rewrites_only_the_days_users_and_equals_the_lake(store, tmp_path):
    lake = tmp_path / "lake"
    _write_lake(lake)
    reports = [update_day(store, lake, day, MAX_EVENTS, KEY) for day in DAYS]
    assert [r.mode for r in reports] == ["rebuild", "incremental", "incremental"]
    for day, r in zip(DAYS, reports):
        active = pd.read_parquet(lake / "user_sequences" / f"date={day}")["user_id"].nunique()
        assert r.users_written == active and r.day == day
    expected = _expected(lake, DAYS[-1])
    assert store.meta().as_of == DAYS[-1] and store.meta().users == len(expected)
    for user, frame in expected.items():
        as_of, events = store.lookup(user)
        assert as_of.as_of == DAYS[-1] and len(events) == len(frame) and _same(events, frame), user
    assert store.lookup("nobody")[1] is None
    rerun = update_day(store, lake, DAYS[-1], MAX_EVENTS, KEY)  # a rerun replaces the day exactly
    assert all(_same(store.lookup(u)[1], f) for u, f in expected.items()), rerun.mode


def _write_item_windows(lake, day: str, rows: list[tuple[str, str, list[int]]]) -> None:
    """lake/item_windows/date=D+1 as the sequence build exports it after day D: (level, key, the four counts)."""
    following = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
    names = list(ITEM_WINDOW_COUNTS)
    frame = pd.DataFrame([{"as_of_date": following, "level": level, "key": key, **dict(zip(names, counts))}
                          for level, key, counts in rows])
    part = lake / "item_windows" / f"date={following}"
    part.mkdir(parents=True)
    frame.astype({n: "int64" for n in names}).to_parquet(part / "part-0.parquet")


def test_the_item_statistics_published_with_a_day_are_the_lakes_and_replace_the_day_befores(store, tmp_path):
    lake = tmp_path / "lake"
    _write_lake(lake)
    _write_item_windows(lake, DAYS[0], [("ad", "i1", [10, 1, 30, 3]), ("ad", "i2", [5, 0, 5, 0]),
                                        ("campaign", "c1", [100, 9, 400, 30])])
    _write_item_windows(lake, DAYS[1], [("ad", "i1", [12, 2, 40, 4]), ("campaign", "c1", [90, 8, 410, 31])])
    reports = [update_day(store, lake, day, MAX_EVENTS, KEY) for day in DAYS[:2]]
    assert [r.item_records for r in reports] == [3, 2] and store.meta().item_records == 2
    stats, missing = store.item_stats(["i1", "i2", "new-ad", "i1"], ["c1", "c1", "c1", None])
    assert stats.shape == (4, len(ITEM_STAT_COLUMNS)) and missing == 2   # i2 dropped out of the windows, new-ad never in
    np.testing.assert_array_equal(stats[0], [12, 2, 40, 4, 90, 8, 410, 31])
    np.testing.assert_array_equal(stats[1], [0, 0, 0, 0, 90, 8, 410, 31])   # no stale record of the day before
    np.testing.assert_array_equal(stats[3], [12, 2, 40, 4, 0, 0, 0, 0])
    update_day(store, lake, DAYS[2], MAX_EVENTS, KEY)   # a day the build exported no statistics for
    assert store.meta().item_records == 0 and store.item_stats(["i1"], ["c1"])[1] == 1


def test_a_reader_sees_the_previous_day_until_the_new_one_is_published(store, tmp_path):
    lake = tmp_path / "lake"
    _write_lake(lake)
    for day in DAYS[:2]:
        update_day(store, lake, day, MAX_EVENTS, KEY)
    before = _expected(lake, DAYS[1])
    seen = []
    day3 = pd.read_parquet(lake / "user_sequences" / f"date={DAYS[2]}").sort_values(["user_id", "seq_index"])
    users = list(dict.fromkeys(day3["user_id"]))

    def updates():
        for user in users:  # between writes, every reader still gets D-1 whole
            for u in users:
                meta, events = store.lookup(u)
                seen.append((meta.as_of, u, _same(events, before[u])))
            g = day3[day3["user_id"] == user]
            yield user, encode({c: g[c].to_numpy(object) for c in g.columns}, KEY)

    store.publish(DAYS[2], updates(), rebuild=False, max_events=MAX_EVENTS, hash_key=KEY)
    assert seen and all(as_of == DAYS[1] and same for as_of, _, same in seen), seen
    after = _expected(lake, DAYS[2])
    assert all(store.lookup(u)[0].as_of == DAYS[2] and _same(store.lookup(u)[1], after[u]) for u in users)


def test_missing_half_written_and_foreign_stores_say_why(tmp_path):
    with pytest.raises(StoreUnavailable, match="no online store"):
        open_store("", tmp_path)
    folder = tmp_path / "online_store"
    writer = LmdbStore(folder, readonly=False)
    with pytest.raises(StoreUnavailable, match="no published day"):
        writer.meta()
    with writer._env.begin(write=True) as txn:
        txn.put(LmdbStore.META, json.dumps({"as_of": "2026-01-01", "format_version": FORMAT_VERSION + 1,
                                            "hash_key": KEY, "max_events": 5, "users": 0,
                                            "published_at": 0.0}).encode())
    writer.close()
    with pytest.raises(StoreUnavailable, match=f"format version {FORMAT_VERSION + 1}"):
        open_store("", tmp_path).meta()
    data = (folder / "data.mdb").read_bytes()
    (folder / "data.mdb").write_bytes(data[:100])  # a copy that stopped half-way
    with pytest.raises(StoreUnavailable, match="half-written or corrupt"):
        open_store("", tmp_path)
