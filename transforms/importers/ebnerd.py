"""EB-NeRD (Ekstra Bladet News Recommendation Dataset, test fixture) -> landing zone.

Source files (``--src`` is the folder): ``behaviors.parquet`` and ``history.parquet`` (read with
pyarrow), or their derived twins ``behaviors.tsv`` / ``history.tsv`` (header, tab-separated, list
columns space-joined) when pyarrow is missing or ``fmt="tsv"``. Both give identical landing bytes.

Mapping:

* each behaviors row is one request (``request_id`` = ``eb-r{impression_id}``) at ``impression_time``;
  EB-NeRD times are naive (local Danish time per the dataset notes) and are read as UTC wall-clock
  time, so the logged hour of day is kept;
* every article of ``article_ids_inview`` -> one **impression** line (``impression_id`` =
  ``eb-i{impression_id}-{k}``, k = 0-based index in the list), ``ad_id`` = ``campaign_id`` = article id,
  ``advertiser_id`` = ``ekstrabladet``, ``category_id`` = ``brand_id`` = ``unknown`` (the fixture has no
  articles.parquet, so no article side info);
* every article of ``article_ids_clicked`` -> one **click** on its in-view impression at ``ts_ms`` + 1 s
  (clamped to the same UTC day), ``click_type`` ``view_details``, ``dwell_ms`` = ``next_read_time`` x 1000
  (the read time on the clicked article; null when missing). A clicked id absent from the in-view
  list could not be attributed and would be counted as dropped (none in the fixture);
* ``position`` = 1: EB-NeRD has no display position and its in-view order is shuffled;
* ``surface``: ``article_id`` empty (front page) -> ``feed``, otherwise (article page) -> ``detail``;
* ``device`` from ``device_type`` via :data:`DEVICE_MAP`: 1 (desktop) -> ``web``, 2 (mobile) ->
  ``android``, 3 (tablet) -> ``ios``. The landing vocabulary (ios/android/web) has no desktop/mobile/
  tablet; the operating system is **not** in the data, so ``android``/``ios`` here only mean
  "mobile"/"tablet". Missing or other codes -> ``web`` (counted in the report's notes);
* every read in history (``article_id_fixed`` at ``impression_time_fixed``: the 21 days before the
  behaviors window) -> one **behavior** line, ``action`` ``view``, at its real timestamp; all 44
  history users are landed, the 6 without behaviors included.
* The page the impression happened on (``article_id``) is not landed as a separate read.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path
from typing import Any, Iterable

from transforms.importers.common import (
    UNKNOWN, Accounting, ImportReport, LandingBuffer, SourceDataError, naive_utc_ms, read_csv, require_file, sort_key,
)
from transforms.importers.skeleton import Importer, Selection

DATASET = "ebnerd"
DEVICE_MAP = {1: "web", 2: "android", 3: "ios"}
DEFAULT_DEVICE = "web"
BEHAVIOR_COLUMNS = ("impression_id", "article_id", "impression_time", "device_type", "article_ids_inview",
                    "article_ids_clicked", "user_id", "next_read_time")
HISTORY_COLUMNS = ("user_id", "impression_time_fixed", "article_id_fixed")
REASON_NO_INVIEW = "empty article_ids_inview"
REASON_CLICK_NOT_IN_VIEW = "clicked article not in article_ids_inview"
REASON_NO_TIME = "read without a timestamp"


def _have_pyarrow() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def _read_parquet(path: Path, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for truncated or non-parquet files
        raise SourceDataError(f"{path}: corrupt or unreadable parquet file ({exc})") from exc
    missing = [c for c in columns if c not in names]
    if missing:
        raise SourceDataError(f"{path}: lacks column(s) {missing}; columns are {names}")
    try:
        return pq.read_table(path, columns=list(columns)).to_pylist()
    except Exception as exc:
        raise SourceDataError(f"{path}: corrupt or unreadable parquet file ({exc})") from exc


def _opt(value: str) -> str | None:
    return value if value not in ("", "nan", "NaN", "None") else None


def _tsv_int(value: str, path: Path, line: int, column: str) -> int | None:
    value = _opt(value)
    if value is None:
        return None
    try:
        f = float(value)
        if not f.is_integer():
            raise ValueError
        return int(f)
    except ValueError:
        raise SourceDataError(f"{path} line {line}: column {column!r} is not an integer: {value!r}") from None


def _tsv_time(value: str, path: Path, line: int, column: str) -> dt.datetime | None:
    value = _opt(value)
    if value is None:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        raise SourceDataError(f"{path} line {line}: column {column!r} is not a timestamp: {value!r}") from None


def _read_behaviors_tsv(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line, r in read_csv(path, BEHAVIOR_COLUMNS, delimiter="\t", quoting=csv.QUOTE_NONE):
        nrt = _opt(r["next_read_time"])
        try:
            next_read = float(nrt) if nrt is not None else None
        except ValueError:
            raise SourceDataError(f"{path} line {line}: column 'next_read_time' is not a number: {nrt!r}") from None
        rows.append({
            "impression_id": _tsv_int(r["impression_id"], path, line, "impression_id"),
            "article_id": _tsv_int(r["article_id"], path, line, "article_id"),
            "impression_time": _tsv_time(r["impression_time"], path, line, "impression_time"),
            "device_type": _tsv_int(r["device_type"], path, line, "device_type"),
            "article_ids_inview": [_tsv_int(v, path, line, "article_ids_inview") for v in r["article_ids_inview"].split()],
            "article_ids_clicked": [_tsv_int(v, path, line, "article_ids_clicked") for v in r["article_ids_clicked"].split()],
            "user_id": _tsv_int(r["user_id"], path, line, "user_id"),
            "next_read_time": next_read,
            "_line": line,
        })
    return rows


def _read_history_tsv(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line, r in read_csv(path, HISTORY_COLUMNS, delimiter="\t", quoting=csv.QUOTE_NONE):
        rows.append({
            "user_id": _tsv_int(r["user_id"], path, line, "user_id"),
            "impression_time_fixed": [_tsv_time(v, path, line, "impression_time_fixed")
                                      for v in r["impression_time_fixed"].split()],
            "article_id_fixed": [_tsv_int(v, path, line, "article_id_fixed") for v in r["article_id_fixed"].split()],
            "_line": line,
        })
    return rows


def _source(src: Path, stem: str, fmt: str) -> tuple[Path, str]:
    if fmt not in ("auto", "parquet", "tsv"):
        raise SourceDataError(f"ebnerd: fmt={fmt!r} is not one of 'auto', 'parquet', 'tsv'")
    if fmt == "parquet" or (fmt == "auto" and _have_pyarrow() and (src / f"{stem}.parquet").exists()):
        if not _have_pyarrow():
            raise SourceDataError("ebnerd: fmt='parquet' needs pyarrow, which is not installed (use fmt='tsv')")
        return require_file(src, f"{stem}.parquet", DATASET), "parquet"
    if fmt == "auto" and not (src / f"{stem}.tsv").exists():
        raise SourceDataError(f"ebnerd: source file {src / (stem + '.parquet')} (or {stem}.tsv) is missing")
    return require_file(src, f"{stem}.tsv", DATASET), "tsv"


def _id(value: Any, path: Path, row: int, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise SourceDataError(f"{path} row {row}: column {column!r} is null")
    return str(value)


class EbNerd(Importer):
    dataset = DATASET

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def locate(self, src: Path) -> None:
        self.b_path, self.b_fmt = _source(src, "behaviors", self.fmt)
        self.h_path, self.h_fmt = _source(src, "history", self.fmt)

    def read(self, acc: Accounting) -> Iterable[Any]:
        b_path, h_path = self.b_path, self.h_path
        behaviors = _read_parquet(b_path, BEHAVIOR_COLUMNS) if self.b_fmt == "parquet" else _read_behaviors_tsv(b_path)
        histories = _read_parquet(h_path, HISTORY_COLUMNS) if self.h_fmt == "parquet" else _read_history_tsv(h_path)
        B, H = b_path.name, h_path.name
        self.inview_key, self.clicked_key, self.reads_key = (
            f"{B} [article_ids_inview]", f"{B} [article_ids_clicked]", f"{H} [reads]")

        # validate and normalise
        self.rows = []
        for i, r in enumerate(behaviors, start=1):
            where = r.get("_line", i)
            when = r["impression_time"]
            if not isinstance(when, dt.datetime):
                raise SourceDataError(f"{b_path} row {where}: impression_time is missing")
            self.rows.append({
                "impression_id": _id(r["impression_id"], b_path, where, "impression_id"),
                "user": _id(r["user_id"], b_path, where, "user_id"),
                "ts": naive_utc_ms(when),
                "front_page": r["article_id"] is None,
                "device_type": r["device_type"],
                "inview": [_id(a, b_path, where, "article_ids_inview") for a in (r["article_ids_inview"] or [])],
                "clicked": [_id(a, b_path, where, "article_ids_clicked") for a in (r["article_ids_clicked"] or [])],
                "dwell": r["next_read_time"],
            })
        self.hist = []
        for i, r in enumerate(histories, start=1):
            where = r.get("_line", i)
            times, arts = r["impression_time_fixed"] or [], r["article_id_fixed"] or []
            if len(times) != len(arts):
                raise SourceDataError(f"{h_path} row {where}: impression_time_fixed has {len(times)} entries "
                                      f"but article_id_fixed {len(arts)}")
            self.hist.append((_id(r["user_id"], h_path, where, "user_id"),
                              [(naive_utc_ms(t) if isinstance(t, dt.datetime) else None,
                                _id(a, h_path, where, "article_id_fixed")) for t, a in zip(times, arts)]))

        acc.source_rows[B] = len(self.rows)
        acc.source_rows[self.inview_key] = sum(len(r["inview"]) for r in self.rows)
        acc.source_rows[self.clicked_key] = sum(len(r["clicked"]) for r in self.rows)
        acc.source_rows[H] = len(self.hist)
        acc.source_rows[self.reads_key] = sum(len(reads) for _, reads in self.hist)
        return [r["user"] for r in self.rows] + [u for u, _ in self.hist]

    def land(self, selection: Selection, acc: Accounting, buf: LandingBuffer) -> None:
        B, inview_key, clicked_key, reads_key = self.b_path.name, self.inview_key, self.clicked_key, self.reads_key
        landed_rows = landed_clicks = 0
        odd_devices = 0
        for r in self.rows:
            reason = selection.excluded(r["user"], r["ts"]) or (None if r["inview"] else REASON_NO_INVIEW)
            if reason:
                acc.drop_unit(reason, {B: 1, inview_key: len(r["inview"]), clicked_key: len(r["clicked"])})
                continue
            landed_rows += 1
            request_id, user, ts = f"eb-r{r['impression_id']}", r["user"], r["ts"]
            device = DEVICE_MAP.get(r["device_type"])
            if device is None:
                device, odd_devices = DEFAULT_DEVICE, odd_devices + 1
            surface = "feed" if r["front_page"] else "detail"
            index: dict[str, int] = {}
            for k, article in enumerate(r["inview"]):
                index.setdefault(article, k)
                buf.impression(request_id, f"eb-i{r['impression_id']}-{k}", user, ts, ad_id=article,
                               campaign_id=article, advertiser_id="ekstrabladet", category=UNKNOWN, brand=UNKNOWN,
                               surface=surface, device=device)
            dwell = r["dwell"]
            missing = dwell is None or (isinstance(dwell, float) and math.isnan(dwell))
            dwell_ms = None if missing else int(round(dwell * 1000))
            for article in r["clicked"]:
                if article not in index:
                    acc.drop(clicked_key, REASON_CLICK_NOT_IN_VIEW)
                    continue
                buf.click(f"eb-i{r['impression_id']}-{index[article]}", request_id, user, article, ts, dwell_ms)
                landed_clicks += 1

        landed_reads = 0
        for user, reads in sorted(self.hist, key=lambda h: sort_key(h[0])):
            for ts, article in reads:
                # the user slice is asked first, then whether the read has a time at all
                reason = REASON_NO_TIME if ts is None and selection.keeps(user) else selection.excluded(user, ts)
                if reason:
                    acc.drop(reads_key, reason)
                    continue
                buf.view(user, ts, article, UNKNOWN, UNKNOWN)
                landed_reads += 1

        acc.expected.update(impressions=acc.kept(inview_key), clicks=acc.kept(clicked_key),
                            behaviors=acc.kept(reads_key))
        acc.balance_rows(B, "rows", landed_rows)
        acc.balance_rows(clicked_key, "clicks", landed_clicks)
        acc.balance_rows(reads_key, "behaviors", landed_reads)
        acc.notes.append(f"read {B} and {self.h_path.name} ({self.b_fmt}/{self.h_fmt}); naive times read as UTC")
        if odd_devices:
            acc.notes.append(
                f"{odd_devices} requests with a missing or unknown device_type landed as device '{DEFAULT_DEVICE}'")

    def options(self) -> dict[str, Any]:
        return {"fmt": None if self.fmt == "auto" else self.fmt}


def import_ebnerd(src: str | Path, out: str | Path, limit_users: int | None = None, *, fmt: str = "auto",
                  since: str | None = None, until: str | None = None, fill_gaps: bool = False) -> ImportReport:
    return EbNerd(fmt).run(src, out, limit_users, since, until, fill_gaps)
