"""A small synthetic generator of the `training_samples` contract (for tests and benchmarks).

Writes `root/date=D/part-0.parquet`, one row per event, rows contiguous per user and sorted
by (user_id, ts_ms, event_rank), exactly the columns of the contract. The world is simple
but learnable: each user likes a few categories; organic behaviors mostly fall in liked
categories; an impression is clicked iff its category is liked and (it sits in the top
bucket or it is the user's favourite category), optionally flipped with probability `noise`.
"""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contracts import ACTIONS, CLICK_TYPES, DAY_MS, ITEM_STAT_COLUMNS, ITEM_STAT_LAG_DAYS, TRAINING_SAMPLES
from transforms.atomic import staged_file

SCHEMA = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in TRAINING_SAMPLES.items()])


def _day_ms(date: str) -> int:
    d = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
    return int(d.timestamp() * 1000)


def _user_timeline(rng, u, n_hist, start_ms, day_ms, n_days, n_cat, n_items, imp_frac, noise, max_reqs, cands):
    liked = rng.choice(n_cat, size=2, replace=False)
    fav = liked[0]
    rows = []

    def label_of(cat, bucket):
        y = int(cat in liked and (bucket == 0 or cat == fav))
        if noise > 0 and rng.random() < noise:
            y = 1 - y
        return y

    def impression(ts, req, k, pos, is_tgt):
        cat = int(rng.choice(liked) if rng.random() < 0.5 else rng.integers(n_cat))
        item = int(rng.integers(n_items))
        bucket = 0 if pos <= 4 else 1
        y = label_of(cat, bucket)
        return dict(user_id=f"u{u}", ts_ms=ts, is_target=is_tgt, event_kind="impression",
                    item_id=f"ad{cat}_{item}", campaign_id=f"c{cat}_{item % 7}", advertiser_id=f"a{item % 11}",
                    category_id=f"cat{cat}", brand_id=f"b{item % 13}", surface=["feed", "search"][pos % 2],
                    device=["ios", "android", "web"][u % 3], action=None, position=pos, position_bucket=bucket,
                    label=y, click_type=(CLICK_TYPES[int(rng.integers(3))] if y else None),
                    dwell_ms=(int(rng.lognormal(9, 1)) if y else None), request_id=req, impression_id=f"{req}_{k}")

    def behavior(ts):
        cat = int(rng.choice(liked) if rng.random() < 0.8 else rng.integers(n_cat))
        item = int(rng.integers(n_items // 4 + 1))  # repeats -> LITM has something to merge
        return dict(user_id=f"u{u}", ts_ms=ts, is_target=False, event_kind="behavior", item_id=f"it{cat}_{item}",
                    campaign_id=None, advertiser_id=None, category_id=f"cat{cat}", brand_id=f"b{item % 13}",
                    surface=None, device=None, action=ACTIONS[int(rng.integers(4))], position=None,
                    position_bucket=None, label=None, click_type=None, dwell_ms=None, request_id=None,
                    impression_id=None)

    hist_ts = np.sort(rng.integers(start_ms, day_ms, size=n_hist))
    i = 0
    while i < n_hist:
        if rng.random() < imp_frac:
            req = f"r{u}_{hist_ts[i]}"
            for k in range(min(2, n_hist - i)):
                rows.append(impression(int(hist_ts[i]), req, k, int(rng.integers(1, 9)), False))
                i += 1
        else:
            rows.append(behavior(int(hist_ts[i])))
            i += 1
    days = []
    for d in range(n_days):
        d0 = day_ms + d * DAY_MS
        drows = []
        n_req = int(rng.integers(1, max_reqs + 1))
        req_ts = np.sort(rng.integers(d0 + 3_600_000, d0 + DAY_MS - 1, size=n_req))
        for b_ts in np.sort(rng.integers(d0, d0 + DAY_MS - 1, size=int(rng.integers(1, 6)))):
            drows.append(behavior(int(b_ts)))
        for r, t in enumerate(req_ts):
            req = f"r{u}_{d}_{r}"
            n_c = int(rng.integers(cands[0], cands[1] + 1))
            for k in range(n_c):
                drows.append(impression(int(t), req, k, k + 1, True))
        drows.sort(key=lambda x: x["ts_ms"])
        days.append(drows)
    return rows, days


def _add_item_stats(df: pd.DataFrame, events: pd.DataFrame, day_ms: int) -> None:
    """The targets' item statistics as the dbt model item_windows counts them: every user's impressions of the
    ad (campaign) in the windows of whole days ending ITEM_STAT_LAG_DAYS before the sample's day."""
    imps = events[events["event_kind"] == "impression"]
    target = df["is_target"].to_numpy(bool)
    for column in ITEM_STAT_COLUMNS:
        level, count, days = column.split("_")
        end = day_ms - (ITEM_STAT_LAG_DAYS - 1) * DAY_MS
        window = imps[(imps["ts_ms"] < end) & (imps["ts_ms"] >= end - int(days[:-1]) * DAY_MS)]
        key = "item_id" if level == "ad" else "campaign_id"
        per_key = window.groupby(key)["label"].agg("count" if count == "impressions" else "sum")
        values = df[key].map(per_key).fillna(0).astype("int64")
        # float with NaN, as pandas reads a dbt-built partition's nullable integers (no nullable Int64 metadata)
        df[column] = np.where(target, values.to_numpy(np.float64), np.nan)


def write_training_samples(root: str, start_date: str = "2026-01-10", n_days: int = 1, n_users: int = 16,
                           hist_len: tuple[int, int] = (10, 40), n_categories: int = 8, n_items: int = 50,
                           imp_frac: float = 0.3, noise: float = 0.0, max_requests: int = 2,
                           candidates: tuple[int, int] = (2, 5), history_days: int = 30, seed: int = 0,
                           row_group_size: int | None = None) -> list[str]:
    """Writes n_days of training samples under root/date=D/part-0.parquet; returns the file paths."""
    rng = np.random.default_rng(seed)
    day0 = _day_ms(start_date)
    per_user = []
    for u in range(n_users):
        n_hist = int(rng.integers(hist_len[0], hist_len[1] + 1))
        per_user.append(_user_timeline(rng, u, n_hist, day0 - history_days * DAY_MS, day0, n_days, n_categories,
                                       n_items, imp_frac, noise, max_requests, candidates))
    paths = []
    for d in range(n_days):
        date = (dt.datetime.strptime(start_date, "%Y-%m-%d") + dt.timedelta(days=d)).strftime("%Y-%m-%d")
        out = []
        for hist, days in per_user:
            prev = [r for dd in days[:d] for r in dd]
            seq = [dict(r, is_target=False) for r in hist + prev] + days[d]
            out.extend(seq)
        df = pd.DataFrame(out)
        df["event_rank"] = df.groupby("user_id").cumcount().astype("int64")
        df = df.sort_values(["user_id", "ts_ms", "event_rank"], kind="stable")
        df["event_rank"] = df.groupby("user_id").cumcount().astype("int64")
        df["event_date"] = pd.to_datetime(df["ts_ms"], unit="ms").dt.date
        _add_item_stats(df, pd.concat([pd.DataFrame(h + [r for dd in days for r in dd]) for h, days in per_user]),
                        _day_ms(date))
        table = pa.Table.from_pandas(df[[f.name for f in SCHEMA]], schema=SCHEMA, preserve_index=False)
        path = os.path.join(root, f"date={date}", "part-0.parquet")
        with staged_file(Path(path)) as staging:
            pq.write_table(table, str(staging), row_group_size=row_group_size)
        paths.append(path)
    return paths
