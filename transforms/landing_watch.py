"""What a watcher of the landing zone needs: which days are usable and why the others are not.

The landing sensor decides from these and a day's fingerprint (transforms.landing.day_fingerprint) whether a
day is new, unchanged since its last successful run, or changed (a file replaced, a file set aside by an
operator, D+1 landed after a grace-period run).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass

from contracts import layout
from transforms.landing import SUCCESS_MARKER


@dataclass(frozen=True)
class LandingScan:
    complete: list[str]   # ISO days with a readable _SUCCESS document, sorted
    problems: list[str]   # one line per landing entry that is skipped, naming its path and why


def scan(root: str | os.PathLike) -> LandingScan:
    """The complete days of the landing zone, and every entry skipped with the reason.

    Skipped: a directory that is not ``date=YYYY-MM-DD``, a day without ``_SUCCESS`` (still being
    written, or written without the marker), a ``_SUCCESS`` that is not a JSON object with ``files``.
    """
    base = layout.landing(root)
    if not base.is_dir():
        return LandingScan([], [])
    complete, problems = [], []
    for entry in sorted(base.iterdir()):
        if entry.name.startswith("."):   # a writer's staging directory (transforms/atomic.staged_dir)
            continue
        day = entry.name.removeprefix(layout.PARTITION_PREFIX)
        if not entry.is_dir() or not entry.name.startswith(layout.PARTITION_PREFIX) or not _is_iso_date(day):
            problems.append(f"{entry}: not a landing day (expected a directory date=YYYY-MM-DD); skipped")
            continue
        marker = entry / SUCCESS_MARKER
        if not marker.exists():
            problems.append(f"{marker}: missing, so {day} is incomplete (its writer has not finished); skipped")
            continue
        try:
            document = json.loads(marker.read_text() or "{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"{marker}: not a JSON document ({exc}); {day} skipped until it is rewritten")
            continue
        if not isinstance(document, dict) or not isinstance(document.get("files", {}), dict):
            problems.append(f"{marker}: expected a JSON object with a 'files' object; {day} skipped until it is rewritten")
            continue
        complete.append(day)
    return LandingScan(complete, problems)


def _is_iso_date(text: str) -> bool:
    try:
        return dt.date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
