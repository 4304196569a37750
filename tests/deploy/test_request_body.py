"""The body limit is counted while reading (a chunked body stops at the limit, the rest is never pulled),
and a non-finite number anywhere in the JSON is a 422 that names its field."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import HTTPException
from starlette.requests import Request

from deploy.request_body import decode_json, read_limited


def test_a_chunked_body_stops_at_the_limit():
    pulled = []

    async def receive():  # the ASGI server's side of a chunked upload of 100 x 300 bytes
        pulled.append(1)
        return {"type": "http.request", "body": b"x" * 300, "more_body": len(pulled) < 100}

    request = Request({"type": "http", "method": "POST", "headers": [], "path": "/v1/score"}, receive)
    with pytest.raises(HTTPException) as refused:
        asyncio.run(read_limited(request, 1000))
    assert refused.value.status_code == 413 and "limit of 1000 bytes" in refused.value.detail
    assert len(pulled) == 4  # 1,200 bytes read, then it stopped


@pytest.mark.parametrize("body, field", [
    (b'{"request_ts_ms": NaN}', "request_ts_ms"),
    (b'{"candidates": [{"ad_id": "a"}, {"ad_id": Infinity}]}', "candidates.1.ad_id"),
    (b'{"history": [{"dwell_ms": -1e999}]}', "history.0.dwell_ms"),
])
def test_non_finite_numbers_are_named(body, field):
    with pytest.raises(HTTPException) as refused:
        decode_json(body)
    assert refused.value.status_code == 422 and refused.value.detail.startswith(f"{field}: non-finite")


def test_finite_json_passes_and_malformed_json_says_so():
    assert decode_json(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    with pytest.raises(HTTPException, match="malformed JSON"):
        decode_json(b'{"a": ')
