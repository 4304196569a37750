"""`genrank replay --day D --url URL`: day D's ad requests from the landing zone, sent through a running
service over HTTP as the ad server would have asked before showing the ads.

An ad request is the impressions of one ``request_id`` in D's impression files: its user, its time (the
first impression's ``ts_ms``) and its ads as candidates in position order, each with the campaign,
advertiser, category, brand, surface and device it was shown with. Requests are sent in time order, each
with the landing's ``request_id`` (the prediction log then joins D's impressions and clicks) and its time
as ``request_ts_ms`` (the service sees the history as of then and logs the request under D).

Lines are judged by the landing contract (transforms/landing.py), with the reasons the events job
quarantines them under (transforms/spark/events.py): a line it would reject is skipped and counted, a
repeated ``impression_id`` is kept once (``duplicate_impression_id``); blank lines are framing.

Bounded: at most ``max_requests`` requests and ``max_seconds`` of sending (the rest are counted as not
sent), over ``concurrency`` connections; only to a loopback address unless ``allow_remote``.
"""
from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

from contracts import DAY_MS
from transforms.landing import (DEVICES, INTEGER_KEYS, REQUIRED_KEYS, SURFACE_SLOTS, SURFACES, day_fingerprint,
                                day_start_ms, open_day, read_lines)

KIND = "impressions"
ENUMS = {"surface": SURFACES, "device": DEVICES}
ID_KEYS = tuple(k for k in REQUIRED_KEYS[KIND] if k not in INTEGER_KEYS[KIND] and k not in ENUMS)
CANDIDATE_KEYS = ("ad_id", "campaign_id", "advertiser_id", "category_id", "brand_id", "surface", "device")
FRAMING = " \t\r\ufeff"  # around a JSON Lines record: whitespace, a CRLF's CR, a byte-order mark
INT64 = 1 << 63
JSON_HEADERS = {"content-type": "application/json"}


def id_text(value) -> str:
    """An id as the events job reads it: a string as it is, any other JSON scalar as its JSON text."""
    return value if isinstance(value, str) else json.dumps(value)


def _object(pairs: list[tuple]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a key is repeated")
    return obj


def impression_problem(record, day_start: int) -> str | None:
    """Why the events job would quarantine this impression (its first rule that applies), or None."""
    if not isinstance(record, dict):
        return "malformed_json"
    if any(record.get(k) is None for k in REQUIRED_KEYS[KIND]):
        return "missing_key"
    if any(type(record[k]) is not int or not -INT64 <= record[k] < INT64 for k in INTEGER_KEYS[KIND]):
        return "bad_type"
    if any(isinstance(record[k], (dict, list)) for k in REQUIRED_KEYS[KIND]):
        return "bad_type"
    if any(record[k] not in domain for k, domain in ENUMS.items()):
        return "unknown_enum"
    if any(not id_text(record[k]).strip() for k in ID_KEYS):
        return "empty_id"
    if not 1 <= record["position"] <= SURFACE_SLOTS[record["surface"]]:
        return "position_out_of_range"
    if not day_start <= record["ts_ms"] < day_start + DAY_MS:
        return "ts_out_of_range"
    return None


@dataclass
class DayRequests:
    bodies: list[bytes]                                   # the score requests, in time order
    lines: int = 0                                        # impression lines read (blank ones excluded)
    skipped: Counter = field(default_factory=Counter)     # reason -> lines


def landing_version(root: Path, day: str) -> str:
    """Which version of day D's landing files day_requests would read (their fingerprint: any file landed again
    changes it)."""
    return day_fingerprint(root, day, include_next=False)


def day_requests(root: Path, day: str) -> DayRequests:
    """Day D's ad requests as score request bodies, and the lines that could not be used."""
    start = day_start_ms(day)
    out = DayRequests([])
    by_request: dict[str, list[dict]] = {}
    seen: set[str] = set()
    for path in open_day(root, day, verify=False).files[KIND]:
        for line in read_lines(path):
            body = line.strip(FRAMING)
            if not body:
                continue
            out.lines += 1
            try:
                record = json.loads(body, object_pairs_hook=_object)
            except ValueError:
                record = None
            problem = impression_problem(record, start)
            if problem is None and id_text(record["impression_id"]) in seen:
                problem = "duplicate_impression_id"
            if problem is not None:
                out.skipped[problem] += 1
                continue
            seen.add(id_text(record["impression_id"]))
            by_request.setdefault(id_text(record["request_id"]), []).append(record)
    requests = []
    for request_id, shown in by_request.items():
        shown.sort(key=lambda r: r["position"])
        first = min(shown, key=lambda r: r["ts_ms"])
        requests.append((first["ts_ms"], request_id, {
            "request_id": request_id, "user_id": id_text(first["user_id"]), "request_ts_ms": first["ts_ms"],
            "candidates": [{k: id_text(r[k]) for k in CANDIDATE_KEYS} for r in shown]}))
    out.bodies = [orjson.dumps(body) for _, _, body in sorted(requests, key=lambda x: x[:2])]
    return out


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"--url {url}: not a loopback address; pass --allow-remote to replay to another host")


@dataclass
class ReplayReport:
    day: str
    requests: int                 # ad requests in the day
    lines: int
    skipped: Counter
    statuses: Counter             # HTTP status -> answers; None: no answer (connection failed, timed out)
    latencies_ms: list[float]
    seconds: float

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    def count(self, lo: int, hi: int) -> int:
        return sum(n for s, n in self.statuses.items() if s is not None and lo <= s < hi)

    def summary(self) -> str:
        ms = np.array(self.latencies_ms) if self.latencies_ms else np.array([np.nan])
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        return "\n".join([
            f"replay {self.day}: {self.requests} ad requests from {self.lines} impression lines "
            f"(skipped: {skipped})",
            f"  sent {self.sent}  ok {self.count(200, 300)}  4xx {self.count(400, 500)}  5xx {self.count(500, 600)}  "
            f"no answer {self.statuses.get(None, 0)}  not sent {self.requests - self.sent}",
            f"  latency p50 {np.percentile(ms, 50):.1f} ms  p99 {np.percentile(ms, 99):.1f} ms  "
            f"({self.seconds:.1f} s)",
            "  by status: " + ", ".join(f"{s} {n}" for s, n in sorted(self.statuses.items(), key=lambda x: str(x[0]))),
        ])


def replay(root: Path, day: str, url: str, max_requests: int = 100_000, max_seconds: float = 600.0,
           concurrency: int = 2, allow_remote: bool = False, timeout_s: float = 30.0) -> ReplayReport:
    if not allow_remote:
        check_loopback(url)
    found = day_requests(root, day)
    pending = iter(found.bodies[:max_requests])
    lock = threading.Lock()
    statuses: Counter = Counter()
    latencies: list[float] = []
    start = time.monotonic()

    def send(client: httpx.Client) -> None:
        while time.monotonic() - start < max_seconds:
            with lock:
                body = next(pending, None)
            if body is None:
                return
            t = time.perf_counter()
            try:
                status = client.post("/v1/score", content=body, headers=JSON_HEADERS).status_code
            except httpx.TransportError:
                status = None
            ms = (time.perf_counter() - t) * 1000
            with lock:
                statuses[status] += 1
                if status is not None:
                    latencies.append(ms)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url, timeout=timeout_s, limits=limits) as client:
        threads = [threading.Thread(target=send, args=(client,), name=f"replay-{i}") for i in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return ReplayReport(day, len(found.bodies), found.lines, found.skipped, statuses, latencies,
                        time.monotonic() - start)
