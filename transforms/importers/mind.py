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
import time
from pathlib import Path

from transforms.importers.common import (
    REASON_OUTSIDE_RANGE,
    REASON_USER_SLICE,
    UNKNOWN,
    Accounting,
    ImportReport,
    LandingBuffer,
    SourceDataError,
    Window,
    click_ts,
    finish,
    naive_utc_ms,
    read_tsv_rows,
    require_dir,
    require_file,
    sort_key,
    user_slice,
)
from transforms.landing import DAY_MS

DATASET = "mind"
BEHAVIORS, NEWS = "behaviors.tsv", "news.tsv"
TIME_FORMAT = "%m/%d/%Y %I:%M:%S %p"
HISTORY_STEP_MS = 60_000
REASON_NO_HISTORY = "history not landed (history=False)"
REASON_EMPTY = "empty impressions column"

EXPOSURES = f"{BEHAVIORS} [exposures]"
LABELLED = f"{BEHAVIORS} [exposures labelled 1]"
HISTORY = f"{BEHAVIORS} [history items, earliest row per user]"


def import_mind(
    src: str | Path,
    out: str | Path,
    limit_users: int | None = None,
    *,
    history: bool = True,
    since: str | None = None,
    until: str | None = None,
    fill_gaps: bool = False,
) -> ImportReport:
    started = time.perf_counter()
    src = require_dir(src, DATASET)
    behaviors_path = require_file(src, BEHAVIORS, DATASET)
    news_path = require_file(src, NEWS, DATASET)
    window = Window.of(since, until)
    acc, buf = Accounting(), LandingBuffer()

    news: dict[str, tuple[str, str]] = {}
    n_news = 0
    for line, f in read_tsv_rows(news_path, 8):
        if not f[0]:
            raise SourceDataError(f"{news_path} line {line}: empty news_id")
        news[f[0]] = (f[1] or UNKNOWN, f[2] or UNKNOWN)
        n_news += 1
    acc.source_rows[NEWS] = n_news

    rows = []  # (ts, file order, impression_id, user, history list, [(news, label)])
    for line, f in read_tsv_rows(behaviors_path, 5):
        imp_id, user, when, hist, imps = f
        if not imp_id or not user:
            raise SourceDataError(f"{behaviors_path} line {line}: empty impression_id or user_id")
        try:
            ts = naive_utc_ms(dt.datetime.strptime(when, TIME_FORMAT))
        except ValueError:
            raise SourceDataError(
                f"{behaviors_path} line {line}: time {when!r} is not 'M/D/YYYY h:mm:ss AM/PM'"
            ) from None
        pairs = []
        for token in imps.split():
            news_id, sep, label = token.rpartition("-")
            if not sep or not news_id or label not in ("0", "1"):
                raise SourceDataError(
                    f"{behaviors_path} line {line}: impressions entry {token!r} is not 'NewsID-0' or 'NewsID-1'"
                )
            pairs.append((news_id, label == "1"))
        rows.append((ts, line, imp_id, user, hist.split(), pairs))
    if not rows:
        raise SourceDataError(f"{behaviors_path}: no rows")

    acc.source_rows[BEHAVIORS] = len(rows)
    acc.source_rows[EXPOSURES] = sum(len(r[5]) for r in rows)
    acc.source_rows[LABELLED] = sum(sum(1 for _, c in r[5] if c) for r in rows)
    rows.sort(key=lambda r: (r[0], r[1]))
    first_row: dict[str, tuple] = {}
    differing = set()
    for r in rows:
        if r[3] not in first_row:
            first_row[r[3]] = r
        elif r[4] != first_row[r[3]][4]:
            differing.add(r[3])
    acc.source_rows[HISTORY] = sum(len(r[4]) for r in first_row.values())
    window_start = (rows[0][0] // DAY_MS) * DAY_MS

    def meta(news_id: str) -> tuple[str, str]:
        return news.get(news_id, (UNKNOWN, UNKNOWN))

    keep_users = user_slice(first_row, limit_users)
    landed_rows = 0
    for ts, _, imp_id, user, _hist, pairs in sorted(rows, key=lambda r: r[1]):  # file order
        reason = None
        if keep_users is not None and user not in keep_users:
            reason = REASON_USER_SLICE
        elif not window.contains(ts):
            reason = REASON_OUTSIDE_RANGE
        elif not pairs:
            reason = REASON_EMPTY
        if reason:
            acc.drop(BEHAVIORS, reason)
            if pairs:
                acc.drop(EXPOSURES, reason, len(pairs))
            if any(c for _, c in pairs):
                acc.drop(LABELLED, reason, sum(1 for _, c in pairs if c))
            continue
        landed_rows += 1
        request_id = f"mind-r{imp_id}"
        for k, (news_id, clicked) in enumerate(pairs):
            impression_id = f"mind-i{imp_id}-{k}"
            category, brand = meta(news_id)
            buf.add("impressions", {
                "request_id": request_id, "impression_id": impression_id, "user_id": user, "ts_ms": ts,
                "ad_id": news_id, "campaign_id": news_id, "advertiser_id": "msn",
                "category_id": category, "brand_id": brand, "position": 1, "surface": "feed", "device": "web",
            })
            if clicked:
                buf.add("clicks", {
                    "impression_id": impression_id, "request_id": request_id, "user_id": user, "ad_id": news_id,
                    "ts_ms": click_ts(ts), "click_type": "view_details", "dwell_ms": None,
                })

    landed_history = 0
    for user in sorted(first_row, key=sort_key):
        items = first_row[user][4]
        if not items:
            continue
        if keep_users is not None and user not in keep_users:
            acc.drop(HISTORY, REASON_USER_SLICE, len(items))
            continue
        if not history:
            acc.drop(HISTORY, REASON_NO_HISTORY, len(items))
            continue
        n = len(items)
        for k, news_id in enumerate(items):
            ts = window_start - (n - k) * HISTORY_STEP_MS
            if not window.contains(ts):
                acc.drop(HISTORY, REASON_OUTSIDE_RANGE)
                continue
            category, brand = meta(news_id)
            buf.add("behaviors", {
                "user_id": user, "ts_ms": ts, "item_id": news_id,
                "category_id": category, "brand_id": brand, "action": "view",
            })
            landed_history += 1

    acc.expected.update(impressions=acc.kept(EXPOSURES), clicks=acc.kept(LABELLED), behaviors=acc.kept(HISTORY))
    acc.balance_rows(BEHAVIORS, "rows", landed_rows)
    acc.balance_rows(HISTORY, "behaviors", landed_history)
    covered = sum(1 for r in rows for n_id, _ in r[5] if n_id in news)
    acc.notes.append(
        f"news.tsv gives a category for {covered:,} of {acc.source_rows[EXPOSURES]:,} exposures; the rest are 'unknown'"
    )
    acc.notes.append(
        f"history lines are synthetic-timed: 1 min apart, ending 1 min before "
        f"{dt.datetime.fromtimestamp(window_start / 1000, dt.timezone.utc):%Y-%m-%d} 00:00 UTC"
        if history else "history column not landed (history=False)"
    )
    if differing:
        acc.notes.append(f"{len(differing)} users have different histories on different rows; the earliest row's was landed")
    options = {"limit_users": limit_users, "history": None if history else "off", "since": window.since,
               "until": window.until, "fill_gaps": fill_gaps}
    return finish(DATASET, src, Path(out), options, acc, buf, fill_gaps, started, window)
