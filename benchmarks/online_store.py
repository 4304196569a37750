"""Online sequence store at scale: build time, lookup latency and a reader's memory, embedded and Redis.

For each backend (LMDB under a scratch directory; Redis on a loopback redis-server started here):
1. Build: publish U synthetic users x E events (as the first ``online_sequences`` run does: a rebuild),
   then one incremental day (10 % of the users, 50 new events each); seconds per million events.
2. Lookup: p50 / p99 of one user's read + decode (what a request does) over random users.
3. Memory: a fresh reader process (the service's imports, the store open, 5,000 lookups) prints its
   RSS split into anonymous memory (its own heap) and file-backed pages (the store's page cache,
   shared by every worker). The same is measured on a store of U/10 users in the same run: the
   anonymous part must not grow with users.

Synthetic events: Zipf-distributed items per user with category/brand/campaign derived from the item,
as ``benchmarks/serving.py``'s histories; ids are hashed as the store holds them.

    python benchmarks/online_store.py                        # 200,000 users x 1,024 events
    python benchmarks/online_store.py --users 20000          # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import numpy as np  # noqa: E402

from deploy.event_codec import ID_COLUMNS, EventArrays  # noqa: E402
from testkit.local_redis import local_redis  # noqa: E402
from deploy.sequence_store import LmdbStore, OnlineStore, RedisStore  # noqa: E402
from models.config import FeatureConfig  # noqa: E402
from models.data import stable_hash  # noqa: E402

KEY = FeatureConfig().hash_key
DAY0, DAY1 = "2026-01-01", "2026-01-02"
NOW = 1_767_225_600_000
# hashed id pools: 5,000 items and their side ids, hashed once (hashing strings is not what is measured)
POOL = {c: stable_hash(np.array([f"{c}{i}" for i in range(5000)], dtype=object), KEY) for c in ID_COLUMNS}


def synthetic_events(rng: np.random.Generator, n: int, t0: int) -> EventArrays:
    items = rng.zipf(1.3, n) % 5000
    is_imp = rng.random(n) < 0.6
    label = np.where(is_imp, (rng.random(n) < 0.05).astype(np.int8), -1).astype(np.int8)
    hashes = np.stack([POOL["item_id"][items], POOL["campaign_id"][items % 700], POOL["advertiser_id"][items % 90],
                       POOL["category_id"][items % 40], POOL["brand_id"][items % 300],
                       np.full(n, POOL["surface"][0]), np.full(n, POOL["device"][0])], 1)
    return EventArrays(ts=t0 + np.sort(rng.integers(0, 30 * 86_400_000, n)), hashes=hashes, is_imp=is_imp,
                       action=np.where(is_imp, 5 + (label == 1), rng.integers(1, 5, n)).astype(np.int8), label=label,
                       click_type=np.zeros(n, np.int8), position=np.where(is_imp, rng.integers(1, 10, n), 0).astype(np.int32),
                       dwell_ms=np.full(n, np.nan))


def users(n_users: int, n_events: int, seed: int, t0: int, every: int = 1):
    rng = np.random.default_rng(seed)
    for u in range(0, n_users, every):
        yield f"user{u:07d}", synthetic_events(rng, n_events, t0)


def build(store: OnlineStore, n_users: int, n_events: int) -> dict:
    t = time.perf_counter()
    store.publish(DAY0, users(n_users, n_events, 0, NOW - 31 * 86_400_000), rebuild=True, max_events=n_events,
                  hash_key=KEY)
    full = time.perf_counter() - t
    t = time.perf_counter()
    store.publish(DAY1, users(n_users, 50, 1, NOW, every=10), rebuild=False, max_events=n_events, hash_key=KEY)
    day = time.perf_counter() - t
    return {"users": n_users, "events": n_users * n_events, "build_s": full,
            "build_s_per_million_events": full / (n_users * n_events / 1e6),
            "incremental_day_users": len(range(0, n_users, 10)), "incremental_day_s": day,
            "incremental_s_per_million_events": day / (len(range(0, n_users, 10)) * 50 / 1e6)}


def lookup_ms(store: OnlineStore, n_users: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    ids = [f"user{u:07d}" for u in rng.integers(0, n_users, n)]
    store.lookup(ids[0])
    out = np.empty(n)
    for i, user in enumerate(ids):
        t = time.perf_counter()
        meta, events = store.lookup(user)
        out[i] = (time.perf_counter() - t) * 1000
        assert events is not None and meta.as_of == DAY1
    return out


READER = """
import json, sys, numpy as np
import deploy.service  # the service's imports: onnxruntime, fastapi, the codec
from deploy.sequence_store import open_store
from pathlib import Path
def rss():
    f = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return {k: int(f[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}
before = rss()
store = open_store(sys.argv[1], Path(sys.argv[2]))
rng = np.random.default_rng(4)
for u in rng.integers(0, int(sys.argv[3]), 5000):
    store.lookup(f"user{u:07d}")
print(json.dumps({"before_mb": before, "after_mb": rss()}))
"""


def reader_rss(setting: str, home: Path, n_users: int) -> dict:
    out = subprocess.run([sys.executable, "-c", READER, setting, str(home), str(n_users)], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_backend(name: str, open_fn, setting_fn, n_users: int, n_events: int, lookups: int, tmp: Path) -> list[dict]:
    rows = []
    for size in (max(1, n_users // 10), n_users):
        store = open_fn(tmp / f"{name}-{size}")
        b = build(store, size, n_events)
        lat = lookup_ms(store, size, lookups)
        rows.append({"backend": name, **b, "lookup_p50_ms": float(np.percentile(lat, 50)),
                     "lookup_p99_ms": float(np.percentile(lat, 99)),
                     "reader_rss": reader_rss(setting_fn(store), tmp / f"{name}-{size}", size)})
        if isinstance(store, RedisStore):
            rows[-1]["redis_used_memory_mb"] = store.client.info("memory")["used_memory"] / 2**20
            store.client.flushdb()  # the next size starts from an empty server
        print(json.dumps(rows[-1]), flush=True)
        store.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--events", type=int, default=1024)
    ap.add_argument("--lookups", type=int, default=20_000)
    ap.add_argument("--backends", default="lmdb,redis")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        tmp = Path(tmp)
        if "lmdb" in a.backends:
            rows += run_backend("lmdb", lambda p: LmdbStore(p / "online_store", readonly=False), lambda s: "",
                                a.users, a.events, a.lookups, tmp)
        if "redis" in a.backends:
            with local_redis(tmp) as url:
                rows += run_backend("redis", lambda p: RedisStore(url), lambda s: url,
                                    a.users, a.events, a.lookups, tmp)
    print("\n| backend | users | events | build s / M events | incremental day s / M events | lookup p50 ms | "
          "lookup p99 ms | reader RSS MB (anon / file) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        after = r["reader_rss"]["after_mb"]
        print(f"| {r['backend']} | {r['users']:,} | {r['events']:,} | {r['build_s_per_million_events']:.2f} | "
              f"{r['incremental_s_per_million_events']:.2f} | {r['lookup_p50_ms']:.3f} | {r['lookup_p99_ms']:.3f} | "
              f"{after['VmRSS']:.0f} ({after['RssAnon']:.0f} / {after['RssFile']:.0f}) |")


if __name__ == "__main__":
    main()
