"""The one flow every real-data importer follows; a dataset's :class:`Importer` supplies only its own parts.

:meth:`Importer.run` does, in this order (the order decides which error a bad call meets first):

1. ``src`` must be a directory (:func:`.common.require_dir`);
2. :meth:`Importer.locate`: the dataset checks its own options and finds its source files;
3. ``since`` / ``until`` become a :class:`.common.Window`;
4. :meth:`Importer.read`: the dataset parses its files strictly, counts their rows in the
   :class:`.common.Accounting` and returns the user ids it saw;
5. ``limit_users`` picks the user slice from those ids (:func:`.common.user_slice`);
6. :meth:`Importer.land`: the dataset builds the lines of every source unit the :class:`Selection` keeps
   and counts every unit it drops with its reason (:meth:`.common.Accounting.drop_unit`), then says how
   many lines must land and which row counts must balance;
7. the buffer lands one call per UTC day, every landed day is read back and the counts are reconciled
   into the :class:`.common.ImportReport` (:func:`finish`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from transforms.importers.common import (
    REASON_OUTSIDE_RANGE,
    REASON_USER_SLICE,
    Accounting,
    Check,
    ImportReport,
    LandingBuffer,
    Window,
    require_dir,
    user_slice,
)
from transforms.landing import FILE_KINDS, open_day


@dataclass(frozen=True)
class Selection:
    """Which source units may land: those of the ``limit_users`` slice (None: every user) inside the window."""

    users: set[str] | None
    window: Window

    def keeps(self, user: str) -> bool:
        return self.users is None or user in self.users

    def excluded(self, user: str, ts_ms: int) -> str | None:
        """Why a unit of ``user`` at ``ts_ms`` does not land (the user slice is asked first), or None."""
        if not self.keeps(user):
            return REASON_USER_SLICE
        if not self.window.contains(ts_ms):
            return REASON_OUTSIDE_RANGE
        return None


class Importer:
    """One dataset's parts of an import. An instance holds the dataset's own options (from its
    constructor) and, between :meth:`read` and :meth:`land`, what it read."""

    dataset: str
    # the summary lists the dataset's own options after limit_users, or (True) before the shared ones
    own_options_first = False

    def locate(self, src: Path) -> None:
        """Check the dataset's own options and find its source files under ``src``, before anything is read."""
        raise NotImplementedError

    def read(self, acc: Accounting) -> Iterable[Any]:
        """Parse the source files, count their rows in ``acc.source_rows``; return every user id seen."""
        raise NotImplementedError

    def land(self, selection: Selection, acc: Accounting, buf: LandingBuffer) -> None:
        """Add the lines of every unit ``selection`` keeps to ``buf`` and count every dropped one in ``acc``; then
        set ``acc.expected``, the row balances and the notes."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The dataset's own options as the report shows them (None or False: not shown)."""
        return {}

    def run(self, src: str | Path, out: str | Path, limit_users: int | None, since: str | None, until: str | None,
            fill_gaps: bool) -> ImportReport:
        started = time.perf_counter()
        src = require_dir(src, self.dataset)
        self.locate(src)
        window = Window.of(since, until)
        acc, buf = Accounting(), LandingBuffer()
        selection = Selection(user_slice(self.read(acc), limit_users), window)
        self.land(selection, acc, buf)
        shared = {"limit_users": limit_users, "since": window.since, "until": window.until, "fill_gaps": fill_gaps}
        own = self.options()
        # a dict keeps the place of its first key: limit_users stays first in the second form
        options = {**own, **shared} if self.own_options_first else {"limit_users": limit_users, **own, **shared}
        return finish(self.dataset, src, Path(out), options, acc, buf, fill_gaps, started, window)


def read_back(out: Path, days: list[str]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Line counts per kind (total and per day) of the landed days, counted by decompressing every
    file with :func:`transforms.landing.open_day` (which also checks them against ``_SUCCESS``)."""
    totals = dict.fromkeys(FILE_KINDS, 0)
    by_day: dict[str, dict[str, int]] = {}
    for day in days:
        counts = open_day(out, day, verify=True).line_counts
        by_day[day] = {kind: counts[kind] for kind in FILE_KINDS}
        for kind in FILE_KINDS:
            totals[kind] += counts[kind]
    return totals, by_day


def finish(
    dataset: str,
    src: Path,
    out: Path,
    options: dict[str, Any],
    acc: Accounting,
    buf: LandingBuffer,
    fill_gaps: bool,
    started: float,
    window: Window | None = None,
) -> ImportReport:
    out = Path(out)
    built = buf.counts()
    days = buf.write(out, fill_gaps=fill_gaps, window=window)
    landed, by_day = read_back(out, days)
    checks = [Check(what, total, accounted) for what, total, accounted in acc.units]
    for kind in FILE_KINDS:
        checks.append(Check(f"{kind} lines derived from the source = lines built", acc.expected[kind], built[kind]))
        checks.append(Check(f"{kind} lines built = lines landed (read back)", built[kind], landed[kind]))
    report = ImportReport(
        dataset=dataset,
        src=Path(src),
        out=out,
        options={k: v for k, v in options.items() if v not in (None, False)},
        source_rows=dict(acc.source_rows),
        expected_lines=dict(acc.expected),
        landed_lines=landed,
        landed_lines_by_day=by_day,
        days=days,
        dropped=dict(sorted(acc.dropped.items())),
        checks=checks,
        notes=list(acc.notes),
        reconciled=all(c.ok for c in checks),
        seconds=time.perf_counter() - started,
    )
    return report
