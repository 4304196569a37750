"""MIND (Microsoft News, MIND-small train subset) -> landing zone.

Source files (``--src`` is the folder, both header-less TSV): ``behaviors.tsv`` (impression_id,
user_id, time ``M/D/YYYY h:mm:ss AM/PM``, history, impressions) and ``news.tsv`` (news_id, category,
subcategory, title, abstract, url, title_entities, abstract_entities).

Mapping:

* each behaviors row is one request (``request_id`` = ``mind-r{impression_id}``) at the row's time,
  read as UTC (MIND gives no time zone);
* every ``NewsID-label`` pair of the impressions column -> one **impression** line
  (``impression_id`` = ``mind-i{impression_id}-{k}``, k = 0-based index in the list), ``ad_id`` =
  ``campaign_id`` = news id, ``advertiser_id`` = ``msn``;
* label 1 -> also one **click** at ``ts_ms`` + 1 s (clamped to the same UTC day), ``click_type``
  ``view_details``, ``dwell_ms`` null; label 0 -> impression only;
* ``category_id`` / ``brand_id`` = the news category / subcategory from news.tsv where the news is
  listed there, else ``unknown`` (this subset's news.tsv covers only ~4 % of the news ids);
* ``position`` = 1 for every line: MIND shuffles the order inside an impression list, so list order is
  **not** a display position; ``surface`` = ``feed``, ``device`` = ``web`` (constants, not in the data);
* the history column (news the user clicked before the split, time-ordered, **without timestamps**)
  -> **behavior** lines (``action`` ``view``, category/brand as above), landed once per user from the
  user's earliest row (in MIND the history is the same on every row of a user; the report notes it
  otherwise). Synthetic timing rule: the n history items of a user are placed 1 minute apart, the
  last one 1 minute before 00:00 UTC of the first day with impressions in the file (2019-11-09 for
  this subset), i.e. item k (0-based) at ``window_start - (n - k) * 60 s``. So every history lands
  before any impression (day 2019-11-08 here, up to 425 minutes before midnight), in its real order,
  and is visible as "history as of the end of the previous day" to every training day.
  ``history=False`` leaves it out (the report counts those items as dropped).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Iterable

from transforms.importers.common import (
    REASON_USER_SLICE, UNKNOWN, Accounting, ImportReport, LandingBuffer, SourceDataError, naive_utc_ms, read_tsv_rows,
    require_file, sort_key,
)
from transforms.importers.skeleton import Importer, Selection
from contracts import DAY_MS

DATASET = "mind"
BEHAVIORS, NEWS = "behaviors.tsv", "news.tsv"
TIME_FORMAT = "%m/%d/%Y %I:%M:%S %p"
HISTORY_STEP_MS = 60_000
REASON_NO_HISTORY = "history not landed (history=False)"
REASON_EMPTY = "empty impressions column"

EXPOSURES = f"{BEHAVIORS} [exposures]"
LABELLED = f"{BEHAVIORS} [exposures labelled 1]"
HISTORY = f"{BEHAVIORS} [history items, earliest row per user]"


class Mind(Importer):
    dataset = DATASET

    def __init__(self, history: bool) -> None:
        self.history = history

    def locate(self, src: Path) -> None:
        self.behaviors_path = require_file(src, BEHAVIORS, DATASET)
        self.news_path = require_file(src, NEWS, DATASET)

    def read(self, acc: Accounting) -> Iterable[Any]:
        self.news: dict[str, tuple[str, str]] = {}
        n_news = 0
        for line, f in read_tsv_rows(self.news_path, 8):
            if not f[0]:
                raise SourceDataError(f"{self.news_path} line {line}: empty news_id")
            self.news[f[0]] = (f[1] or UNKNOWN, f[2] or UNKNOWN)
            n_news += 1
        acc.source_rows[NEWS] = n_news

        path = self.behaviors_path
        rows = []  # (ts, file order, impression_id, user, history list, [(news, label)])
        for line, f in read_tsv_rows(path, 5):
            imp_id, user, when, hist, imps = f
            if not imp_id or not user:
                raise SourceDataError(f"{path} line {line}: empty impression_id or user_id")
            try:
                ts = naive_utc_ms(dt.datetime.strptime(when, TIME_FORMAT))
            except ValueError:
                raise SourceDataError(f"{path} line {line}: time {when!r} is not 'M/D/YYYY h:mm:ss AM/PM'") from None
            pairs = []
            for token in imps.split():
                news_id, sep, label = token.rpartition("-")
                if not sep or not news_id or label not in ("0", "1"):
                    raise SourceDataError(
                        f"{path} line {line}: impressions entry {token!r} is not 'NewsID-0' or 'NewsID-1'"
                    )
                pairs.append((news_id, label == "1"))
            rows.append((ts, line, imp_id, user, hist.split(), pairs))
        if not rows:
            raise SourceDataError(f"{path}: no rows")

        acc.source_rows[BEHAVIORS] = len(rows)
        acc.source_rows[EXPOSURES] = sum(len(r[5]) for r in rows)
        acc.source_rows[LABELLED] = sum(sum(1 for _, c in r[5] if c) for r in rows)
        rows.sort(key=lambda r: (r[0], r[1]))
        self.first_row: dict[str, tuple] = {}
        self.differing = set()
        for r in rows:
            if r[3] not in self.first_row:
                self.first_row[r[3]] = r
            elif r[4] != self.first_row[r[3]][4]:
                self.differing.add(r[3])
        acc.source_rows[HISTORY] = sum(len(r[4]) for r in self.first_row.values())
        self.window_start = (rows[0][0] // DAY_MS) * DAY_MS
        self.rows = rows
        return self.first_row

    def meta(self, news_id: str) -> tuple[str, str]:
        return self.news.get(news_id, (UNKNOWN, UNKNOWN))

    def land(self, selection: Selection, acc: Accounting, buf: LandingBuffer) -> None:
        landed_rows = 0
        for ts, _, imp_id, user, _hist, pairs in sorted(self.rows, key=lambda r: r[1]):  # file order
            reason = selection.excluded(user, ts) or (None if pairs else REASON_EMPTY)
            if reason:
                acc.drop_unit(reason, {BEHAVIORS: 1, EXPOSURES: len(pairs), LABELLED: sum(1 for _, c in pairs if c)})
                continue
            landed_rows += 1
            request_id = f"mind-r{imp_id}"
            for k, (news_id, clicked) in enumerate(pairs):
                impression_id = f"mind-i{imp_id}-{k}"
                category, brand = self.meta(news_id)
                buf.impression(request_id, impression_id, user, ts, ad_id=news_id, campaign_id=news_id,
                               advertiser_id="msn", category=category, brand=brand)
                if clicked:
                    buf.click(impression_id, request_id, user, news_id, ts)

        landed_history = 0
        for user in sorted(self.first_row, key=sort_key):
            items = self.first_row[user][4]
            if not items:
                continue
            if not selection.keeps(user):
                acc.drop(HISTORY, REASON_USER_SLICE, len(items))
                continue
            if not self.history:
                acc.drop(HISTORY, REASON_NO_HISTORY, len(items))
                continue
            n = len(items)
            for k, news_id in enumerate(items):
                ts = self.window_start - (n - k) * HISTORY_STEP_MS
                reason = selection.excluded(user, ts)
                if reason:
                    acc.drop(HISTORY, reason)
                    continue
                buf.view(user, ts, news_id, *self.meta(news_id))
                landed_history += 1

        acc.expected.update(impressions=acc.kept(EXPOSURES), clicks=acc.kept(LABELLED), behaviors=acc.kept(HISTORY))
        acc.balance_rows(BEHAVIORS, "rows", landed_rows)
        acc.balance_rows(HISTORY, "behaviors", landed_history)
        covered = sum(1 for r in self.rows for n_id, _ in r[5] if n_id in self.news)
        acc.notes.append(f"news.tsv gives a category for {covered:,} of {acc.source_rows[EXPOSURES]:,} exposures; "
                         f"the rest are 'unknown'")
        acc.notes.append(
            f"history lines are synthetic-timed: 1 min apart, ending 1 min before "
            f"{dt.datetime.fromtimestamp(self.window_start / 1000, dt.timezone.utc):%Y-%m-%d} 00:00 UTC"
            if self.history else "history column not landed (history=False)"
        )
        if self.differing:
            acc.notes.append(
                f"{len(self.differing)} users have different histories on different rows; the earliest row's was landed"
            )

    def options(self) -> dict[str, Any]:
        return {"history": None if self.history else "off"}


def import_mind(src: str | Path, out: str | Path, limit_users: int | None = None, *, history: bool = True,
                since: str | None = None, until: str | None = None, fill_gaps: bool = False) -> ImportReport:
    return Mind(history).run(src, out, limit_users, since, until, fill_gaps)
