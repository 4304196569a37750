"""Synthetic event-lake partitions in the Spark job's output schema, for testing the dbt stage alone.

Random but seeded: users with impressions (labels, positions, surfaces) and organic behaviors,
including same-millisecond ties, so order and tie-break rules are exercised.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

import contracts
from transforms import landing

SURFACE_SLOTS = {"feed": 5, "search": 8, "detail": 3}


def make_day(day: str, seed: int, n_users: int = 12, mean_events: int = 25) -> pd.DataFrame:
    rng = np.random.default_rng([seed, int(day.replace("-", ""))])
    start = landing.day_start_ms(day)
    rows = []
    for user in range(n_users):
        n = int(rng.poisson(mean_events))
        if n == 0 or rng.random() < 0.2:  # some users inactive on a given day
            continue
        ts = np.sort(start + rng.integers(0, contracts.DAY_MS // 4, n) * 4)  # coarse times: ties happen
        for k, t in enumerate(ts):
            if rng.random() < 0.6:
                surface = ("feed", "search", "detail")[int(rng.integers(3))]
                pos = int(rng.integers(1, SURFACE_SLOTS[surface] + 1))
                rows.append(dict(event_kind="impression", user_id=f"u{user}", ts_ms=int(t),
                                 request_id=f"r{day}-{user}-{k}", impression_id=f"i{day}-{user}-{k}",
                                 item_id=f"a{int(rng.integers(50))}", ad_id=None, campaign_id=f"c{int(rng.integers(9))}",
                                 advertiser_id=f"v{int(rng.integers(4))}", category_id=f"k{int(rng.integers(6))}",
                                 brand_id=f"b{int(rng.integers(12))}", position=pos, surface=surface,
                                 device="ios", action=None, label=int(rng.random() < 0.3 / pos),
                                 click_type=None, dwell_ms=None, click_ts_ms=None))
            else:
                rows.append(dict(event_kind="behavior", user_id=f"u{user}", ts_ms=int(t), request_id=None,
                                 impression_id=None, item_id=f"it{int(rng.integers(40))}", ad_id=None,
                                 campaign_id=None, advertiser_id=None, category_id=f"k{int(rng.integers(6))}",
                                 brand_id=f"b{int(rng.integers(12))}", position=None, surface=None, device=None,
                                 action=("view", "cart", "fav", "buy")[int(rng.integers(4))], label=None,
                                 click_type=None, dwell_ms=None, click_ts_ms=None))
    df = pd.DataFrame(rows)
    df["ad_id"] = df["item_id"].where(df["event_kind"] == "impression")
    for c in ("ts_ms", "dwell_ms", "click_ts_ms"):
        df[c] = df[c].astype("Int64")
    df["position"] = df["position"].astype("Int32")
    df["label"] = df["label"].astype("Int32")
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].astype("string")
    return df


def write_lake(home: Path, days: list[str], seed: int = 0, **kw) -> None:
    for day in days:
        part = Path(home) / "lake" / "events" / f"date={day}"
        part.mkdir(parents=True, exist_ok=True)
        make_day(day, seed, **kw).to_parquet(part / "part-00000.parquet", index=False)


def day_range(start: str, n: int) -> list[str]:
    d = dt.date.fromisoformat(start)
    return [(d + dt.timedelta(days=i)).isoformat() for i in range(n)]
