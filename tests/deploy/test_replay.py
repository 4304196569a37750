"""`genrank replay`'s reading of a landing day: ad requests as the ad server asked them (grouped by request,
candidates in position order, at their time), every unusable line skipped with the events job's reason,
and no replay to a host that is not loopback unless asked."""

from __future__ import annotations

import json

import orjson
import pytest

from deploy.replay import check_loopback, day_requests
from transforms.landing import day_start_ms, write_day

DAY = "2026-01-05"
T0 = day_start_ms(DAY) + 3_600_000


def _impression(request: str, position: int, ad: int, ts: int = T0, **changes) -> dict:
    return {"request_id": request, "impression_id": f"{request}-{position}", "user_id": 7, "ts_ms": ts, "ad_id": ad,
            "campaign_id": 1, "advertiser_id": 2, "category_id": 3, "brand_id": 4, "position": position,
            "surface": "feed", "device": "ios", **changes}


def test_a_day_becomes_its_ad_requests_and_its_bad_lines_are_counted_by_reason(tmp_path):
    good = [_impression("q2", 2, 20, T0 + 5), _impression("q2", 1, 10, T0 + 5), _impression("q1", 1, 30)]
    lines = [json.dumps(r) for r in good] + [
        json.dumps(good[0]),                                            # a repeated line
        "", "  \r",                                                     # framing, not records
        '{"request_id": "q3", "user_id": 7',                            # cut
        '{"a": 1, "a": 2}',                                             # a repeated key
        json.dumps({k: v for k, v in _impression("q4", 1, 1).items() if k != "ad_id"}),
        json.dumps(_impression("q5", 1, 1, ts="noon")),
        json.dumps({**_impression("q6", 1, 1), "position": True}),
        json.dumps(_impression("q7", 1, 1, surface="tv")),
        json.dumps(_impression("q8", 1, 1, user_id=" ")),
        json.dumps(_impression("q9", 6, 1)),                            # feed has 5 slots
        json.dumps(_impression("q10", 1, 1, ts=T0 + 86_400_000)),       # the next day
    ]
    write_day(tmp_path, DAY, {"impressions": lines})
    found = day_requests(tmp_path, DAY)
    assert found.lines == len(lines) - 2
    assert found.skipped == {"duplicate_impression_id": 1, "malformed_json": 2, "missing_key": 1, "bad_type": 2,
                             "unknown_enum": 1, "empty_id": 1, "position_out_of_range": 1, "ts_out_of_range": 1}
    assert [orjson.loads(b) for b in found.bodies] == [  # in time order; ids as the events job reads them
        {"request_id": "q1", "user_id": "7", "request_ts_ms": T0, "candidates": [
            {"ad_id": "30", "campaign_id": "1", "advertiser_id": "2", "category_id": "3", "brand_id": "4",
             "surface": "feed", "device": "ios"}]},
        {"request_id": "q2", "user_id": "7", "request_ts_ms": T0 + 5, "candidates": [
            {"ad_id": ad, "campaign_id": "1", "advertiser_id": "2", "category_id": "3", "brand_id": "4",
             "surface": "feed", "device": "ios"} for ad in ("10", "20")]}]


@pytest.mark.parametrize("url, allowed", [("http://127.0.0.1:8000", True), ("http://localhost:8000", True),
                                          ("http://[::1]:8000", True), ("http://10.1.2.3:8000", False),
                                          ("http://scoring.internal:8000", False)])
def test_only_loopback_unless_allowed(url, allowed):
    if allowed:
        check_loopback(url)
    else:
        with pytest.raises(ValueError, match="allow-remote"):
            check_loopback(url)
