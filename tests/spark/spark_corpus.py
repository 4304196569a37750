"""Hand-made landing corpora for the events job tests (independent of the simulator).

``make_world`` writes a few days through ``transforms.landing.write_day`` with known defects and
returns a manifest in the simulator's schema (``files[day][kind][defect] = count``) plus the truth
(expected label, click type and dwell per clean impression), so the same accounting assertions run
against this corpus and against the simulator's tiny world.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import contracts
from transforms import landing
from transforms.landing import FILE_KINDS, dumps

DEFECT_KEYS = ("lines", "duplicate_line", "duplicate_impression_id", "malformed_json", "missing_key",
               "bad_type", "orphan_click", "late_click", "extra_field", "out_of_order")


def impression(day: str, k: int, ts_ms: int, user: int, position: int = 1, surface: str = "feed") -> dict:
    return {
        "request_id": f"r-{day}-{k // 3}", "impression_id": f"i-{day}-{k}", "user_id": user,
        "ts_ms": ts_ms, "ad_id": 1000 + k % 17, "campaign_id": 50 + k % 5, "advertiser_id": 7 + k % 3,
        "category_id": k % 11, "brand_id": f"b{k % 4}", "position": position, "surface": surface,
        "device": ("ios", "android", "web")[k % 3],
    }


def click(imp: dict, ts_ms: int, click_type: str = "view_details", dwell_ms: int | None = 1234) -> dict:
    c = {"impression_id": imp["impression_id"], "request_id": imp["request_id"], "user_id": imp["user_id"],
         "ad_id": imp["ad_id"], "ts_ms": ts_ms, "click_type": click_type}
    if dwell_ms is not None:
        c["dwell_ms"] = dwell_ms
    return c


def behavior(ts_ms: int, user: int, item: int, action: str = "view") -> dict:
    return {"user_id": user, "ts_ms": ts_ms, "item_id": item, "category_id": item % 7, "brand_id": item % 5,
            "action": action}


@dataclass
class World:
    root: Path
    days: list[str]
    manifest: dict
    # impression_id -> (label, click_type, dwell_ms) for every impression that must be accepted
    truth: dict[str, tuple[int, str | None, int | None]] = field(default_factory=dict)


def _empty_counts(kind: str) -> dict[str, int]:
    keys = [k for k in DEFECT_KEYS if k != "duplicate_impression_id" or kind == "impressions"]
    return {k: 0 for k in keys}


def make_world(root: Path, start: str = "2026-03-01", n_days: int = 3, n_imps: int = 60, n_beh: int = 30,
               seed: int = 0) -> World:
    rng = random.Random(seed)
    days = [(dt.date.fromisoformat(start) + dt.timedelta(days=i)).isoformat() for i in range(n_days)]
    files: dict[str, dict[str, list[str]]] = {d: {k: [] for k in FILE_KINDS} for d in days + ["_after"]}
    counts = {d: {k: _empty_counts(k) for k in FILE_KINDS} for d in days}
    truth: dict[str, tuple[int, str | None, int | None]] = {}

    def put(day: str, kind: str, line: str) -> None:
        if day in files and day != "_after":
            files[day][kind].append(line)

    for di, day in enumerate(days):
        start_ms = landing.day_start_ms(day)
        nxt = days[di + 1] if di + 1 < len(days) else "_after"
        imps = []
        for k in range(n_imps):
            # the last few impressions sit just before midnight so that their clicks cross it
            ts = start_ms + contracts.DAY_MS - rng.randint(60_000, 20 * 60_000) if k >= n_imps - 4 else \
                start_ms + rng.randint(0, contracts.DAY_MS - 3_600_000)
            surface = ("feed", "search", "detail")[k % 3]
            imps.append(impression(day, k, ts, user=rng.randint(1, 9), position=rng.randint(1, landing.SURFACE_SLOTS[surface]),
                                   surface=surface))
        imps.sort(key=lambda r: r["ts_ms"])
        # roles (distinct records): defects on impressions, duplicates of clean ones
        idx = list(range(n_imps))
        rng.shuffle(idx)
        destroyed = {"malformed_json": idx[0:2], "missing_key": idx[2:4], "bad_type": idx[4:7]}
        dup_line, relog, extra = idx[7:10], idx[10:12], idx[12:14]
        destroyed_ids = {imps[i]["impression_id"] for v in destroyed.values() for i in v}

        clicked = [i for i in range(n_imps) if rng.random() < 0.35 or imps[i]["ts_ms"] > start_ms + contracts.DAY_MS - 25 * 60_000]
        click_defects: dict[int, str] = {}
        clean_clicks = [i for i in clicked if imps[i]["impression_id"] not in destroyed_ids]
        for j, i in enumerate(clean_clicks[:3]):
            click_defects[i] = ("malformed_json", "missing_key", "bad_type")[j]
        click_dup = clean_clicks[3:5]

        for i, imp in enumerate(imps):
            raw = dict(imp)
            if i in extra:
                raw["debug_trace"] = "x"
                counts[day]["impressions"]["extra_field"] += 1
            line = dumps(raw)
            if i in destroyed["malformed_json"]:
                line = line[: len(line) // 2]
                counts[day]["impressions"]["malformed_json"] += 1
            elif i in destroyed["missing_key"]:
                raw.pop(("ts_ms", "position", "user_id", "surface")[i % 4])
                line = dumps(raw)
                counts[day]["impressions"]["missing_key"] += 1
            elif i in destroyed["bad_type"]:
                raw[("ts_ms", "position")[i % 2]] = ("soon", 1.5, True)[i % 3]
                line = dumps(raw)
                counts[day]["impressions"]["bad_type"] += 1
            put(day, "impressions", line)
            if i in dup_line:
                put(day, "impressions", line)
                counts[day]["impressions"]["duplicate_line"] += 1
            if i in relog:
                again = dict(raw, ts_ms=raw["ts_ms"] + rng.randint(1, 500))
                put(day, "impressions", dumps(again))
                counts[day]["impressions"]["duplicate_impression_id"] += 1

            label, ctype, dwell = 0, None, None
            if i in clicked:
                cts = imp["ts_ms"] + rng.randint(1_000, 30 * 60_000)
                ctype = ("view_details", "add_to_cart", "follow")[i % 3]
                dwell = None if i % 5 == 0 else rng.randint(100, 90_000)
                c = click(imp, cts, ctype, dwell)
                cday = day if landing.day_of_ms(cts).isoformat() == day else nxt
                cline = dumps(c)
                if cday != "_after":
                    if imp["impression_id"] in destroyed_ids:
                        counts[cday]["clicks"]["orphan_click"] += 1
                    elif i in click_defects:
                        d = click_defects[i]
                        counts[cday]["clicks"][d] += 1
                        if d == "malformed_json":
                            cline = cline[:-7]
                        elif d == "missing_key":
                            cline = dumps({k: v for k, v in c.items() if k != "click_type"})
                        else:
                            cline = dumps(dict(c, ts_ms=str(cts)))
                    else:
                        counts[cday]["clicks"]["late_click"] += int(cday != day)  # attributed to D-1
                        if i in click_dup:
                            put(cday, "clicks", cline)
                            counts[cday]["clicks"]["duplicate_line"] += 1
                    put(cday, "clicks", cline)
                if imp["impression_id"] not in destroyed_ids and i not in click_defects and cday != "_after":
                    label = 1
                else:
                    ctype = dwell = None
            if imp["impression_id"] not in destroyed_ids:
                truth[imp["impression_id"]] = (label, ctype if label else None, dwell if label else None)

        for b in range(n_beh):
            rec = behavior(start_ms + rng.randint(0, contracts.DAY_MS - 1), rng.randint(1, 9), rng.randint(1, 40),
                           ("view", "cart", "fav", "buy")[b % 4])
            line = dumps(rec)
            if b == 0:
                line = line[:10]
                counts[day]["behaviors"]["malformed_json"] += 1
            elif b == 1:
                line = dumps({k: v for k, v in rec.items() if k != "action"})
                counts[day]["behaviors"]["missing_key"] += 1
            elif b == 2:
                line = dumps(dict(rec, ts_ms=float(rec["ts_ms"]) + 0.5))
                counts[day]["behaviors"]["bad_type"] += 1
            elif b == 3:
                put(day, "behaviors", line)
                counts[day]["behaviors"]["duplicate_line"] += 1
            put(day, "behaviors", line)

    for day in days:
        for kind in FILE_KINDS:
            counts[day][kind]["lines"] = len(files[day][kind])
        landing.write_day(root, day, files[day])
    manifest = {"preset": "handmade", "seed": seed, "days": days, "files": counts}
    (root / "simulator").mkdir(parents=True, exist_ok=True)
    (root / "simulator" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return World(root, days, manifest, truth)
