"""The landing zone: the raw ad-server log format every source writes and the events job reads.

Layout under a data root (``GENRANK_HOME``)::

    landing/date=YYYY-MM-DD/impressions-00000.jsonl.gz
    landing/date=YYYY-MM-DD/clicks-00000.jsonl.gz
    landing/date=YYYY-MM-DD/behaviors-00000.jsonl.gz
    landing/date=YYYY-MM-DD/_SUCCESS          # written last; a day without it is incomplete

Every line is one JSON object. A day's files are first written into a hidden sibling directory and
renamed into place, so a reader never sees a half-written day. ``_SUCCESS`` holds a small JSON
document with the line count of every file, so consumers can close their row accounting against it.

Ids are JSON integers or strings (the events job treats every id as an opaque string); ``ts_ms`` is
UTC epoch milliseconds; a day is a UTC calendar day.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from transforms.atomic import staged_dir

FILE_KINDS = ("impressions", "clicks", "behaviors")

# Keys a well-formed line of each kind must carry. ``dwell_ms`` is optional on clicks (may be null
# or absent: not every click reports a dwell).
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "impressions": (
        "request_id", "impression_id", "user_id", "ts_ms", "ad_id", "campaign_id",
        "advertiser_id", "category_id", "brand_id", "position", "surface", "device",
    ),
    "clicks": ("impression_id", "request_id", "user_id", "ad_id", "ts_ms", "click_type"),
    "behaviors": ("user_id", "ts_ms", "item_id", "category_id", "brand_id", "action"),
}
OPTIONAL_KEYS: dict[str, tuple[str, ...]] = {"impressions": (), "clicks": ("dwell_ms",), "behaviors": ()}
# Fields that must be JSON integers (anything else, a numeric string included, is a bad type).
INTEGER_KEYS: dict[str, tuple[str, ...]] = {
    "impressions": ("ts_ms", "position"),
    "clicks": ("ts_ms", "dwell_ms"),
    "behaviors": ("ts_ms",),
}
SURFACES = ("feed", "search", "detail")
DEVICES = ("ios", "android", "web")
CLICK_TYPES = ("view_details", "add_to_cart", "follow")
ACTIONS = ("view", "cart", "fav", "buy")

SUCCESS_MARKER = "_SUCCESS"
DAY_MS = 86_400_000


class LandingError(ValueError):
    """A landing day or file is unusable; the message names the path and what is wrong."""


def day_dir(root: str | os.PathLike, day: dt.date | str) -> Path:
    return Path(root) / "landing" / f"date={_iso(day)}"


def day_start_ms(day: dt.date | str) -> int:
    d = dt.date.fromisoformat(_iso(day))
    return int(dt.datetime(d.year, d.month, d.day, tzinfo=dt.timezone.utc).timestamp() * 1000)


def day_of_ms(ts_ms: int) -> dt.date:
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.timezone.utc).date()


def _iso(day: dt.date | str) -> str:
    return day if isinstance(day, str) else day.isoformat()


@dataclass(frozen=True)
class LandingDay:
    day: str
    path: Path
    files: dict[str, list[Path]]
    line_counts: dict[str, int]


def write_day(root: str | os.PathLike, day: dt.date | str, lines: dict[str, Iterable[str]]) -> Path:
    """Atomically (re)write one landing day from already-serialised JSON lines per file kind.

    Lines are passed through verbatim, so a source can land defective lines on purpose (the
    simulator does). The previous version of the day, if any, is replaced as a whole.
    """
    final = day_dir(root, day)
    counts: dict[str, int] = {}
    with staged_dir(final) as staging:
        for kind in FILE_KINDS:
            name = f"{kind}-00000.jsonl.gz"
            n = 0
            # mtime=0 keeps the gzip bytes a pure function of the content (deterministic output).
            with open(staging / name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                for line in lines.get(kind, ()):
                    gz.write(line.encode("utf-8") + b"\n")
                    n += 1
            counts[name] = n
        (staging / SUCCESS_MARKER).write_text(json.dumps({"day": _iso(day), "files": counts}, sort_keys=True))
    return final


def complete_days(root: str | os.PathLike) -> list[str]:
    """ISO dates of landing days carrying a ``_SUCCESS`` marker, sorted."""
    base = Path(root) / "landing"
    if not base.is_dir():
        return []
    days = []
    for p in base.iterdir():
        if p.is_dir() and p.name.startswith("date=") and (p / SUCCESS_MARKER).exists():
            days.append(p.name.removeprefix("date="))
    return sorted(days)


def open_day(root: str | os.PathLike, day: dt.date | str, verify: bool = True) -> LandingDay:
    """Check that a landing day is complete and readable; raise LandingError naming the problem.

    With ``verify`` every gzip member is decompressed once and its line count compared with the
    count in ``_SUCCESS``, so a corrupt or truncated file is caught before any job reads it.
    """
    path = day_dir(root, day)
    if not path.is_dir():
        raise LandingError(f"landing day {_iso(day)} is missing: no directory {path}")
    marker = path / SUCCESS_MARKER
    if not marker.exists():
        raise LandingError(f"landing day {_iso(day)} is incomplete: {marker} does not exist (the writer has not finished)")
    try:
        declared = json.loads(marker.read_text() or "{}").get("files", {})
    except json.JSONDecodeError as exc:
        raise LandingError(f"{marker}: not a JSON document ({exc})") from exc
    files: dict[str, list[Path]] = {}
    counts: dict[str, int] = {}
    for kind in FILE_KINDS:
        found = sorted(path.glob(f"{kind}-*.jsonl.gz"))
        if not found:
            raise LandingError(f"landing day {_iso(day)}: no {kind}-*.jsonl.gz file in {path}")
        files[kind] = found
        total = 0
        for f in found:
            if f.stat().st_size == 0:
                raise LandingError(f"{f}: empty file (0 bytes; a gzip member is expected even for zero lines)")
            if verify:
                n = _count_lines(f)
                if f.name in declared and declared[f.name] != n:
                    raise LandingError(f"{f}: {n} lines but {marker.name} declares {declared[f.name]}")
                total += n
        counts[kind] = total
    return LandingDay(_iso(day), path, files, counts)


def _count_lines(path: Path) -> int:
    try:
        with gzip.open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LandingError(f"{path}: corrupt gzip ({exc})") from exc


def read_lines(path: Path) -> list[str]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh]
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LandingError(f"{path}: corrupt gzip ({exc})") from exc


def dumps(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"))
