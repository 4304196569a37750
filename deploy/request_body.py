"""Reading and decoding a request body: a byte limit however the body is framed, and strict JSON.

The limit is counted while the body is read, so a ``Transfer-Encoding: chunked`` body (no
Content-Length) stops at the limit with a 413 instead of being read whole. JSON is decoded with orjson,
which refuses the non-finite literals (``NaN``, ``Infinity``) Python's parser accepts; when it refuses a
body, the standard parser finds which field held the non-finite number so the 422 can name it.
"""
from __future__ import annotations

import json
import math

import orjson
from fastapi import HTTPException, Request


async def read_limited(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HTTPException(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body exceeds the limit of {limit} bytes (stopped reading at {size})")
        chunks.append(chunk)
    return b"".join(chunks)


class _NonFinite:
    def __init__(self, literal: str):
        self.literal = literal


def _float(literal: str):
    value = float(literal)
    return value if math.isfinite(value) else _NonFinite(literal)  # 1e999 overflows to infinity


def _non_finite_path(value, path: tuple = ()) -> tuple[tuple, str] | None:
    if isinstance(value, _NonFinite):
        return path, value.literal
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_path(item, path + (key,))
        if found is not None:
            return found
    return None


def decode_json(body: bytes):
    """The body's JSON value; a 422 naming the problem (and the field of a non-finite number) otherwise."""
    if not body.strip():
        raise HTTPException(422, "body: the request body is empty; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as strict_error:
        try:  # what orjson refuses but Python's parser reads: non-finite literals, integers beyond 64 bits
            value = json.loads(body, parse_constant=_NonFinite, parse_float=_float)
        except (ValueError, RecursionError):
            raise HTTPException(422, f"body: malformed JSON ({strict_error})") from None
    found = _non_finite_path(value)
    if found is not None:
        path, literal = found
        field = ".".join(str(p) for p in path) or "body"
        raise HTTPException(422, f"{field}: non-finite number {literal} is not allowed (JSON numbers must be finite)")
    return value
