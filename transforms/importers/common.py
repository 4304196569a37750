"""Shared machinery of the real-data importers: errors, source readers, the import report, the landing
buffer and the accounting. :mod:`.skeleton` runs them in the one flow every importer follows.

Every importer reads its source files strictly (a missing column, a short row or an unparsable value
raises :class:`SourceDataError` naming the file, the line and what is wrong), turns each source unit
(a rating, an exposure in an impression list, a read in a history list, ...) into landing lines,
and lands them through :func:`transforms.landing.write_day`, one call per UTC day.

Accounting. An importer counts, independently of the lines it builds, how many source rows (and
list elements) each file holds, how many of them it drops and why, and how many lines of each kind
the kept units must give. After writing, every landed day is read back with
:func:`transforms.landing.open_day` (files decompressed, counts checked against ``_SUCCESS``) and the
line counts are compared with those expectations; the report is ``reconciled`` only when
every equation closes exactly. With the default options nothing is dropped.

Conventions shared by every importer (see each module for its mapping):

* ``ts_ms`` is UTC epoch milliseconds, a JSON integer. Sources whose timestamps carry no time zone
  (MIND, EB-NeRD) are read as UTC wall-clock time, so the logged hour of day is kept as it is.
* A click line is written at its impression's ``ts_ms`` + :data:`CLICK_DELAY_MS` (1 s), clamped to the
  last millisecond of the impression's UTC day, so a click always lands in its impression's day.
* ``request_id`` / ``impression_id`` are strings, unique and a pure function of the source row,
  prefixed by the dataset (``ml-``, ``mind-``, ``eb-``, ``obd-``).
* Within a day, lines of each kind are sorted by ``ts_ms`` (ties keep source order); key order in each
  JSON object is fixed. Two runs over the same source give byte-identical landing files.
* ``limit_users=N`` keeps the first N users in sorted user-id order (numeric ids sorted as numbers);
  the rows of other users are counted as dropped (reason ``user not in --limit-users slice``).
* ``since`` / ``until`` (ISO dates, inclusive) keep events whose UTC day lies in the range; the rest
  are counted as dropped (reason ``outside --since/--until``). ``fill_gaps=True`` also writes empty
  (zero-line, ``_SUCCESS``-marked) days between the first and last landed day (widened to
  ``since``/``until`` when given), so the daily partitions form a contiguous range.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from contracts import DAY_MS
from transforms.landing import (
    FILE_KINDS,
    REQUIRED_KEYS,
    day_of_ms,
    dumps,
    write_day,
)

CLICK_DELAY_MS = 1_000
UNKNOWN = "unknown"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MS = dt.timedelta(milliseconds=1)

REASON_USER_SLICE = "user not in --limit-users slice"
REASON_OUTSIDE_RANGE = "outside --since/--until"


class SourceDataError(ValueError):
    """A source dataset is unusable: unknown name, missing directory or file, corrupt content.

    The message names the dataset, directory or file (and line) and says what is wrong.
    """


# ----------------------------------------------------------------------------------------------
# time helpers


def naive_utc_ms(value: dt.datetime) -> int:
    """Epoch ms of a datetime; a naive one is read as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - _EPOCH) // _MS


def click_ts(impression_ts_ms: int) -> int:
    """The synthetic click time: impression + CLICK_DELAY_MS, kept inside the impression's UTC day."""
    day_end = (impression_ts_ms // DAY_MS) * DAY_MS + DAY_MS - 1
    return max(impression_ts_ms, min(impression_ts_ms + CLICK_DELAY_MS, day_end))


def parse_day(value: str | dt.date | None, option: str) -> dt.date | None:
    if value is None or isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(value)
    except ValueError as exc:
        raise SourceDataError(f"--{option} {value!r}: not an ISO date YYYY-MM-DD") from exc


@dataclass(frozen=True)
class Window:
    """An inclusive range of UTC days; open ends accept everything."""

    since: dt.date | None = None
    until: dt.date | None = None

    @classmethod
    def of(cls, since: str | dt.date | None, until: str | dt.date | None) -> "Window":
        w = cls(parse_day(since, "since"), parse_day(until, "until"))
        if w.since and w.until and w.since > w.until:
            raise SourceDataError(f"--since {w.since} is after --until {w.until}: the range is empty")
        return w

    @property
    def bounded(self) -> bool:
        return self.since is not None or self.until is not None

    def contains(self, ts_ms: int) -> bool:
        if not self.bounded:
            return True
        d = day_of_ms(ts_ms)
        return (self.since is None or d >= self.since) and (self.until is None or d <= self.until)


# ----------------------------------------------------------------------------------------------
# source access


def require_dir(src: str | Path, dataset: str) -> Path:
    path = Path(src)
    if not path.exists():
        raise SourceDataError(f"{dataset}: source directory {path} does not exist")
    if not path.is_dir():
        raise SourceDataError(f"{dataset}: source path {path} is not a directory")
    return path


def require_file(src: Path, name: str, dataset: str) -> Path:
    path = src / name
    if not path.is_file():
        hint = ""
        nested = [p for p in sorted(src.glob(f"*/{name}"))][:3] if src.is_dir() else []
        if nested:
            hint = f" (found {', '.join(str(p) for p in nested)}: point --src at that folder)"
        raise SourceDataError(f"{dataset}: source file {path} is missing{hint}")
    if path.stat().st_size == 0:
        raise SourceDataError(f"{path}: empty file (0 bytes)")
    return path


def read_csv(
    path: Path, required: Iterable[str], delimiter: str = ",", quoting: int = csv.QUOTE_MINIMAL
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) of a CSV with a header; every row must have the header's width."""
    required = tuple(required)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh, delimiter=delimiter, quoting=quoting, strict=True)
            try:
                header = next(reader)
            except StopIteration:
                raise SourceDataError(f"{path}: no header line (the file is empty)") from None
            missing = [c for c in required if c not in header]
            if missing:
                raise SourceDataError(f"{path}: header lacks column(s) {missing}; header is {header[:12]}")
            width = len(header)
            for row in reader:
                if len(row) != width:
                    raise SourceDataError(
                        f"{path} line {reader.line_num}: expected {width} fields, got {len(row)} "
                        f"(truncated or corrupt row: {','.join(row)[:80]!r})"
                    )
                yield reader.line_num, dict(zip(header, row))
    except csv.Error as exc:
        raise SourceDataError(f"{path}: corrupt CSV ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise SourceDataError(f"{path}: not UTF-8 text ({exc})") from exc


def read_tsv_rows(path: Path, width: int) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number, fields) of a header-less TSV whose every line has exactly ``width`` fields."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            for n, line in enumerate(fh, start=1):
                line = line.rstrip("\r\n")
                fields = line.split("\t")
                if len(fields) != width:
                    raise SourceDataError(
                        f"{path} line {n}: expected {width} tab-separated fields, got {len(fields)} "
                        f"(truncated or corrupt row: {line[:80]!r})"
                    )
                yield n, fields
    except UnicodeDecodeError as exc:
        raise SourceDataError(f"{path}: not UTF-8 text ({exc})") from exc


def parse_int(value: str, path: Path, line: int, column: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SourceDataError(f"{path} line {line}: column {column!r} is not an integer: {value!r}") from None


def parse_float(value: str, path: Path, line: int, column: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SourceDataError(f"{path} line {line}: column {column!r} is not a number: {value!r}") from None


def sort_key(user_id: Any) -> tuple:
    """Numeric ids sort as numbers, before any non-numeric id."""
    s = str(user_id)
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def user_slice(users: Iterable[Any], limit_users: int | None) -> set[str] | None:
    """The first ``limit_users`` user ids in sorted order, or None for all users."""
    if limit_users is None:
        return None
    if isinstance(limit_users, bool) or not isinstance(limit_users, int) or limit_users < 1:
        raise SourceDataError(f"limit_users={limit_users!r}: expected a positive integer or None")
    return {str(u) for u in sorted({str(u) for u in users}, key=sort_key)[:limit_users]}


# ----------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Check:
    what: str
    expected: int
    actual: int

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


@dataclass
class ImportReport:
    """What an import read, landed and dropped, and whether the counts close."""

    dataset: str
    src: Path
    out: Path
    options: dict[str, Any] = field(default_factory=dict)
    source_rows: dict[str, int] = field(default_factory=dict)  # per source file (and per list column)
    expected_lines: dict[str, int] = field(default_factory=dict)  # per kind, derived from the source
    landed_lines: dict[str, int] = field(default_factory=dict)  # per kind, read back from the files
    landed_lines_by_day: dict[str, dict[str, int]] = field(default_factory=dict)
    days: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # "file: reason" -> source units
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reconciled: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        out = [f"import {self.dataset}: {self.src} -> {self.out / 'landing'}"]
        if self.options:
            out.append("  options: " + ", ".join(f"{k}={v}" for k, v in self.options.items()))
        span = f" ({self.days[0]} .. {self.days[-1]})" if self.days else ""
        out.append(f"  days landed: {len(self.days)}{span}")
        out.append("  source rows:")
        width = max((len(k) for k in self.source_rows), default=0)
        for name, n in self.source_rows.items():
            out.append(f"    {name:<{width}}  {n:>10,}")
        out.append("  landed lines: " + ", ".join(f"{k} {self.landed_lines.get(k, 0):,}" for k in FILE_KINDS))
        imps, clicks = self.landed_lines.get("impressions", 0), self.landed_lines.get("clicks", 0)
        if imps:
            out.append(f"  CTR: {clicks / imps:.2%}")
        if self.dropped:
            out.append("  dropped:")
            for reason, n in sorted(self.dropped.items()):
                out.append(f"    {reason}: {n:,}")
        else:
            out.append("  dropped: none")
        out.append("  reconciliation:")
        for c in self.checks:
            mark = "ok " if c.ok else "BAD"
            out.append(f"    [{mark}] {c.what}: expected {c.expected:,}, landed/accounted {c.actual:,}")
        for note in self.notes:
            out.append(f"  note: {note}")
        out.append(f"  reconciled: {'yes' if self.reconciled else 'NO'}  ({self.seconds:.1f} s)")
        return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# building and landing lines


class LandingBuffer:
    """Collects serialised lines per (UTC day, kind) and lands them day by day."""

    def __init__(self) -> None:
        self._lines: dict[str, dict[str, list[tuple[int, int, str]]]] = defaultdict(lambda: defaultdict(list))
        self._seq = 0

    def add(self, kind: str, record: dict[str, Any]) -> None:
        missing = [k for k in REQUIRED_KEYS[kind] if k not in record]
        if missing:  # a programming error in an importer, never a data problem
            raise AssertionError(f"{kind} line lacks required keys {missing}: {record}")
        ts = record["ts_ms"]
        self._seq += 1
        self._lines[day_of_ms(ts).isoformat()][kind].append((ts, self._seq, dumps(record)))

    def impression(self, request_id: str, impression_id: str, user: str, ts_ms: int, *, ad_id: str,
                   campaign_id: str, advertiser_id: str, category: str, brand: str, position: int = 1,
                   surface: str = "feed", device: str = "web") -> None:
        """An impression line; position 1 on the feed of the web is what a dataset without them gets."""
        self.add("impressions", {
            "request_id": request_id, "impression_id": impression_id, "user_id": user, "ts_ms": ts_ms,
            "ad_id": ad_id, "campaign_id": campaign_id, "advertiser_id": advertiser_id,
            "category_id": category, "brand_id": brand, "position": position, "surface": surface, "device": device,
        })

    def click(self, impression_id: str, request_id: str, user: str, ad_id: str, impression_ts_ms: int,
              dwell_ms: int | None = None) -> None:
        """The click on an impression, at the synthetic click time :func:`click_ts`."""
        self.add("clicks", {
            "impression_id": impression_id, "request_id": request_id, "user_id": user, "ad_id": ad_id,
            "ts_ms": click_ts(impression_ts_ms), "click_type": "view_details", "dwell_ms": dwell_ms,
        })

    def view(self, user: str, ts_ms: int, item_id: str, category: str, brand: str) -> None:
        """A behavior line: ``user`` read ``item_id`` at ``ts_ms``."""
        self.add("behaviors", {
            "user_id": user, "ts_ms": ts_ms, "item_id": item_id,
            "category_id": category, "brand_id": brand, "action": "view",
        })

    def counts(self) -> dict[str, int]:
        totals = dict.fromkeys(FILE_KINDS, 0)
        for kinds in self._lines.values():
            for kind, lines in kinds.items():
                totals[kind] += len(lines)
        return totals

    def write(self, out: Path, fill_gaps: bool = False, window: Window | None = None) -> list[str]:
        """Land every day with lines; with ``fill_gaps`` every day from the first to the last one, the
        range widened to ``window.since`` / ``window.until`` where those are given."""
        days = sorted(self._lines)
        window = window or Window()
        if fill_gaps and (days or (window.since and window.until)):
            first = window.since or dt.date.fromisoformat(days[0])
            last = window.until or dt.date.fromisoformat(days[-1])
            days = [(first + dt.timedelta(n)).isoformat() for n in range((last - first).days + 1)]
        for day in days:
            kinds = self._lines.get(day, {})
            write_day(out, day, {k: [line for _, _, line in sorted(kinds.get(k, ()))] for k in FILE_KINDS})
        return days


class Accounting:
    """Source-side counters of one import: rows, drops, expected lines and unit equations."""

    def __init__(self) -> None:
        self.source_rows: dict[str, int] = {}
        self.dropped: dict[str, int] = defaultdict(int)
        self.expected: dict[str, int] = dict.fromkeys(FILE_KINDS, 0)
        self.units: list[tuple[str, int, int]] = []  # (what, total, kept + dropped)
        self.notes: list[str] = []

    def drop(self, file: str, reason: str, n: int = 1) -> None:
        self.dropped[f"{file}: {reason}"] += n

    def drop_unit(self, reason: str, held: dict[str, int]) -> None:
        """Count one dropped source unit (a row with its list elements) under ``reason`` in every file or
        list column of ``held``, by how many of that file's rows the unit holds; a 0 counts nothing."""
        for file, n in held.items():
            if n:
                self.drop(file, reason, n)

    def dropped_for(self, file: str) -> int:
        return sum(n for k, n in self.dropped.items() if k.startswith(f"{file}: "))

    def balance(self, what: str, total: int, accounted: int) -> None:
        """Record that ``total`` source units are all either landed or dropped (``accounted``)."""
        self.units.append((what, total, accounted))

    def kept(self, file: str) -> int:
        """Source rows of ``file`` not dropped: the lines they must land as."""
        return self.source_rows[file] - self.dropped_for(file)

    def balance_rows(self, file: str, landed_as: str, landed: int) -> None:
        """Record that every source row of ``file`` landed (as one of ``landed`` ``landed_as``) or was dropped."""
        self.balance(f"{file} rows = {landed_as} landed + rows dropped", self.source_rows[file],
                     landed + self.dropped_for(file))
