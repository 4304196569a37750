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
UTC epoch milliseconds; a day is a UTC calendar day. Files are JSON Lines as written in the wild: LF or
CRLF endings, an optional UTF-8 byte-order mark, blank lines and whitespace around an object are all
valid; a file may hold several gzip members (appended writes).

A day whose ``_SUCCESS`` declares zero lines in all is a *source-declared empty day* (a gap in a real
dataset, a holiday with no traffic): it is a recorded, empty partition, not an error.

Operator release of a blocked day: :func:`quarantine_file` (``genrank landing quarantine-file PATH
--reason TEXT``) moves a corrupt file out of the day into ``lake/quarantine_files/date=D/`` and appends
an entry to ``lake/quarantine_files/ledger.jsonl``; :func:`open_day` then accepts the day without it and
reports the entry, so the day's accounting names what was set aside and why.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import itertools
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from contracts import layout
from transforms.atomic import staged_dir, staged_file

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
# Ad slots per surface: an impression's position is 1..slots of its surface.
SURFACE_SLOTS = {"feed": 5, "search": 8, "detail": 3}

SUCCESS_MARKER = "_SUCCESS"
GZIP_MAGIC = b"\x1f\x8b"
RELEASE_HINT = "set it aside with `genrank landing quarantine-file PATH --reason TEXT`, then resume with `genrank run --start DAY`"


class LandingError(ValueError):
    """A landing day or file is unusable; the message names the path and what is wrong."""


def day_dir(root: str | os.PathLike, day: dt.date | str) -> Path:
    return layout.day_dir(layout.landing(root), _iso(day))


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
    line_counts: dict[str, int]            # per kind; counted only by open_day(verify=True)
    declared: dict[str, int] = field(default_factory=dict)   # file name -> lines, as _SUCCESS lists them
    quarantined_files: list[dict] = field(default_factory=list)  # operator ledger entries of this day

    @property
    def declared_empty(self) -> bool:
        """The source declares the day empty: _SUCCESS lists zero lines in all, and no unlisted file."""
        present = {p.name for found in self.files.values() for p in found}
        return sum(self.declared.values()) == 0 and present <= set(self.declared)


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
            # mtime=0 keeps the gzip bytes a pure function of the content (deterministic output); level 6 is zlib's
            # and gzip(1)'s default: 9 (GzipFile's) took 2.6x the time for files 11 % smaller (simulated days)
            with open(staging / name, "wb") as raw, \
                    gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
                # a compress call per line was most of a write's time; batches give the same bytes
                remaining = iter(lines.get(kind, ()))
                while batch := list(itertools.islice(remaining, 4096)):
                    gz.write(("\n".join(batch) + "\n").encode("utf-8"))
                    n += len(batch)
            counts[name] = n
        (staging / SUCCESS_MARKER).write_text(json.dumps({"day": _iso(day), "files": counts}, sort_keys=True))
    return final


def land_days(src_root: str | os.PathLike, dst_root: str | os.PathLike, days: Iterable[str],
              more: Iterable[tuple[str | os.PathLike, str]] = ()) -> None:
    """Copies complete days (and ``more``: (root, day) pairs) from one landing zone into another at once, as an
    upstream delivering a backlog would: each is staged beside the landing zone first, then all are renamed
    into place back to back, so no sensor tick sees part of the set."""
    layout.landing(dst_root).mkdir(parents=True, exist_ok=True)
    staged = []
    for src, day in [(src_root, d) for d in days] + list(more):
        staging = layout.landing(dst_root) / f".staging-{day}"
        shutil.copytree(day_dir(src, day), staging)
        staged.append((staging, day))
    for staging, day in staged:
        staging.rename(day_dir(dst_root, day))


def shift_day(day: str, days: int) -> str:
    """The ISO date ``days`` after (or before) ``day``."""
    return (dt.date.fromisoformat(day) + dt.timedelta(days=days)).isoformat()


def day_fingerprint(root: str | os.PathLike, day: str, include_next: bool) -> str:
    """A short digest of what events(day) reads: the day's files and ``_SUCCESS`` and, when the run uses
    it, D+1's (late clicks label D's impressions). Any added, removed or replaced file changes it. Files are
    stat-ed, not hashed: the landing sensor fingerprints every landed day every tick, and replacing a file
    changes its size or modification time."""
    digest = hashlib.sha256()
    days = [day, shift_day(day, 1)] if include_next else [day]
    for d in days:
        folder = day_dir(root, d)
        digest.update(f"{d}\n".encode())
        for f in sorted(folder.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                st = f.stat()
                digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        digest.update((folder / SUCCESS_MARKER).read_bytes())
    return digest.hexdigest()[:16]


def is_complete(root: str | os.PathLike, day: dt.date | str) -> bool:
    """A landing day is complete once its ``_SUCCESS`` marker is in place (a writer renames it in whole)."""
    return (day_dir(root, day) / SUCCESS_MARKER).exists()


def next_day_decision(day: str, next_complete: bool, now: dt.datetime, grace_hours: float) -> str:
    """Whether day D's events 'use' D+1's clicks, 'skip' them (D+1 is still incomplete ``grace_hours``
    after it ended: D runs without its late clicks), or 'wait' for them. The one rule the events asset,
    the landing sensor and `genrank status` apply."""
    if next_complete:
        return "use"
    due = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc) + dt.timedelta(days=2)
    return "skip" if now >= due + dt.timedelta(hours=grace_hours) else "wait"


def complete_days(root: str | os.PathLike) -> list[str]:
    """ISO dates of landing days carrying a ``_SUCCESS`` marker, sorted."""
    return [day for day in layout.days_in(layout.landing(root)) if day_dir(root, day).is_dir() and is_complete(root, day)]


def open_day(root: str | os.PathLike, day: dt.date | str, verify: bool = True) -> LandingDay:
    """Check that a landing day is complete and readable; raise LandingError naming the problem.

    Always: the marker exists and parses, every declared file is present (or set aside by an operator,
    see :func:`quarantine_file`), every file is non-empty and starts with the gzip magic bytes. With
    ``verify`` every gzip member is also decompressed and its line count compared with ``_SUCCESS``
    (importers do this; the events job instead checks the counts Spark reads against ``declared``).
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
    set_aside = quarantined_files(root, day)
    moved = {e["file"] for e in set_aside}
    absent = sorted(name for name in declared if name not in moved and not (path / name).exists())
    if absent:
        raise LandingError(f"landing day {_iso(day)}: {', '.join(absent)} declared in {marker.name} but not in {path}")
    files: dict[str, list[Path]] = {}
    counts: dict[str, int] = {}
    for kind in FILE_KINDS:
        found = sorted(path.glob(f"{kind}-*.jsonl.gz"))
        if not found and declared and not any(e["kind"] == kind for e in set_aside):
            raise LandingError(f"landing day {_iso(day)}: no {kind}-*.jsonl.gz file in {path}")
        files[kind] = found
        total = 0
        for f in found:
            _check_gzip_header(f)
            if verify:
                n = _count_lines(f)
                if f.name in declared and declared[f.name] != n:
                    raise LandingError(f"{f}: {n} lines but {marker.name} declares {declared[f.name]}")
                total += n
        counts[kind] = total
    return LandingDay(_iso(day), path, files, counts, {k: int(v) for k, v in declared.items()}, set_aside)


def _check_gzip_header(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(2)
    if not head:
        raise LandingError(f"{path}: empty file (0 bytes; a gzip member is expected even for zero lines)")
    if head != GZIP_MAGIC:
        raise LandingError(f"{path}: corrupt gzip (not a gzip file: starts with {head!r}); {RELEASE_HINT}")


def _count_lines(path: Path) -> int:
    try:
        with gzip.open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LandingError(f"{path}: corrupt gzip ({exc}); {RELEASE_HINT}") from exc


def read_lines(path: Path) -> list[str]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh]
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LandingError(f"{path}: corrupt gzip ({exc})") from exc


# json.dumps builds a new encoder on every call with a non-default argument; the simulator serialises millions
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def dumps(record: dict) -> str:
    return _COMPACT.encode(record)


def quarantine_ledger_path(root: str | os.PathLike) -> Path:
    return layout.dataset(root, layout.QUARANTINE_FILES) / "ledger.jsonl"


def quarantined_files(root: str | os.PathLike, day: dt.date | str) -> list[dict]:
    """The operator ledger's entries for one landing day (files set aside by :func:`quarantine_file`)."""
    ledger = quarantine_ledger_path(root)
    if not ledger.exists():
        return []
    entries = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["day"] == _iso(day)]


def quarantine_file(root: str | os.PathLike, file: str | os.PathLike, reason: str) -> dict:
    """Move a landing file out of its day into ``lake/quarantine_files/date=D/`` and record why.

    The ledger (``lake/quarantine_files/ledger.jsonl``) is rewritten atomically with the new entry
    (day, file, kind, reason, the lines ``_SUCCESS`` declared for it, size, sha256, time, new path);
    the move happens after the ledger names it, so no file ever leaves a day unrecorded.
    """
    root = Path(root).resolve()
    src = Path(file).resolve()
    landing_dir = layout.landing(root)
    if src.parent.parent != landing_dir or not src.parent.name.startswith(layout.PARTITION_PREFIX):
        raise LandingError(f"{src}: not a file of a landing day under {landing_dir}")
    if not src.is_file():
        raise LandingError(f"{src}: no such landing file")
    if not reason.strip():
        raise LandingError("a reason is required (it goes into the ledger and the day's accounting)")
    day = src.parent.name.removeprefix(layout.PARTITION_PREFIX)
    kind = next((k for k in FILE_KINDS if src.name.startswith(f"{k}-")), None)
    if kind is None:
        raise LandingError(f"{src}: not a landing file ({', '.join(f'{k}-*.jsonl.gz' for k in FILE_KINDS)})")
    marker = src.parent / SUCCESS_MARKER
    declared = json.loads(marker.read_text() or "{}").get("files", {}) if marker.exists() else {}
    dest = layout.partition(root, layout.QUARANTINE_FILES, day) / src.name
    if dest.exists():
        dest = dest.with_name(f"{src.name}.{uuid.uuid4().hex[:8]}")
    entry = {"day": day, "file": src.name, "kind": kind, "reason": reason.strip(),
             "declared_lines": declared.get(src.name), "bytes": src.stat().st_size,
             "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
             "quarantined_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "moved_to": str(dest.relative_to(root))}
    ledger = quarantine_ledger_path(root)
    with staged_file(ledger) as tmp:
        tmp.write_text((ledger.read_text() if ledger.exists() else "") + json.dumps(entry, sort_keys=True) + "\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
    return entry
