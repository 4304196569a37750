"""Sequence building around the dbt-duckdb project: input checks, window planning, Parquet exports.

The dbt project (transforms/dbt) builds, for a window of days [start, end], the daily tables in
``warehouse.duckdb``: position_ctr, position_buckets, item_stats, user_stats, the incremental
``user_sequences`` store and ``training_samples``. This module holds what surrounds one invocation:

* ``check_event_partitions``: every day of the window has an events partition with the expected
  columns and types, else a ``SequenceInputError`` that names the day and the column;
* ``plan_window``: the rule that rebuilding day D invalidates state(D..): a window that ends before
  the last day already built is extended to it, so later days are recomputed consistently;
* ``export_day``: the day's samples and appended sequence events as Parquet, written atomically, and the
  item statistics for the requests of the next day (the online store publishes them with the day).

Exported layout (what models/data/samples.py streams): ``lake/training_samples/date=D/part-0.parquet`` is a
flat table, one row per event, rows contiguous per user and sorted by (user_id, event_rank), written
in row groups of ROW_GROUP_ROWS; a sample is a run of rows with one user_id; ``is_target`` marks D's
impressions. ``lake/user_sequences/date=D/part-0.parquet`` holds the events appended on D with
their ``seq_index`` (the user's state as of D is every earlier partition's rows of that user with
seq_index > length(D) - max_seq_len).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from contracts import EVENT_COLUMNS, NOT_STAGED, layout
from transforms.atomic import staged_dir

DBT_PROJECT_DIR = Path(__file__).resolve().parent / "dbt"
ROW_GROUP_ROWS = 65_536

# Columns the dbt staging model reads from the event lake (contracts.EVENT_COLUMNS), by type family:
# stg_events.sql casts, so any string or any integer width is accepted.
EXPECTED_EVENT_COLUMNS: dict[str, str] = {
    c: ("string" if t == "string" else "int") for c, t in EVENT_COLUMNS.items() if c not in NOT_STAGED}


class SequenceInputError(ValueError):
    """The event lake cannot feed the sequence build; the message names the day and the column."""


def _days(start: str, end: str) -> list[str]:
    s, e = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    return [(s + dt.timedelta(days=i)).isoformat() for i in range((e - s).days + 1)]


def _family(arrow_type) -> str:
    text = str(arrow_type)
    if text in ("string", "large_string") or text.startswith("string"):
        return "string"
    if "int" in text:
        return "int"
    return text


def check_event_partitions(home: Path, start: str, end: str) -> dict[str, int]:
    """Rows per day of the window; raise SequenceInputError for a missing or reshaped partition."""
    rows = {}
    for day in _days(start, end):
        part = layout.partition(home, layout.EVENTS, day)
        files = sorted(part.glob("*.parquet")) if part.is_dir() else []
        if not files:
            raise SequenceInputError(
                f"events partition {day} is missing ({part} has no Parquet file): materialise events for {day} first")
        n = 0
        for f in files:
            schema = pq.read_schema(f)
            for column, family in EXPECTED_EVENT_COLUMNS.items():
                if column not in schema.names:
                    raise SequenceInputError(f"events partition {day}: column {column!r} is missing in {f.name}")
                got = _family(schema.field(column).type)
                if got != family:
                    raise SequenceInputError(
                        f"events partition {day}: column {column!r} has type {schema.field(column).type}, "
                        f"expected {family} ({f.name})")
            n += pq.ParquetFile(f).metadata.num_rows
        rows[day] = n
    return rows


@dataclass(frozen=True)
class Window:
    start: str
    end: str
    requested_end: str

    @property
    def extended(self) -> bool:
        return self.end != self.requested_end

    @property
    def days(self) -> list[str]:
        return _days(self.start, self.end)

    def dbt_vars(self, **extra) -> dict:
        return {"start_date": self.start, "end_date": self.end, **extra}


def last_built_day(warehouse: Path) -> str | None:
    if not Path(warehouse).exists():
        return None
    import duckdb

    with duckdb.connect(str(warehouse), read_only=True) as con:
        if not con.execute("select count(*) from information_schema.tables where table_name = 'user_sequences'").fetchone()[0]:
            return None
        last = con.execute("select max(added_date) from user_sequences").fetchone()[0]
    return last.isoformat() if last else None


def recorded_empty_day(home: Path, day: str) -> bool:
    """Day D's events partition exists and holds no row: a day the source declared empty (the events
    asset's blocking ``events_not_empty`` lets no other empty partition through). It appends nothing,
    so state(D) = state(D-1) and the next day builds on the day before it."""
    files = sorted(layout.partition(home, layout.EVENTS, day).glob("*.parquet"))
    return bool(files) and sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 0


def plan_window(home: Path, start: str, end: str) -> Window:
    """The window to build: [start, max(end, last built day)], after checking its event partitions.

    Days between the last built day and ``start`` may only be recorded empty days (they add no event,
    so nothing of the state is missing); any other gap is refused naming the first missing day.
    """
    last = last_built_day(Path(home) / "warehouse.duckdb")
    if last:
        following = (dt.date.fromisoformat(last) + dt.timedelta(days=1)).isoformat()
        before_start = (dt.date.fromisoformat(start) - dt.timedelta(days=1)).isoformat()
        gap = [d for d in _days(following, before_start) if not recorded_empty_day(home, d)] if start > following else []
        if gap:
            raise SequenceInputError(
                f"user_sequences is built up to {last}; day {gap[0]} must be built before {start} "
                "(state(D) extends state(D-1))")
    window = Window(start, last if last and last > end else end, end)
    check_event_partitions(home, window.start, window.end)
    return window


def _atomic_copy(con, query: str, final: Path) -> None:
    with staged_dir(final) as staging:
        con.execute(f"copy ({query}) to '{staging / 'part-0.parquet'}' (format parquet, row_group_size {ROW_GROUP_ROWS})")


@dataclass
class DayExport:
    day: str
    samples: int
    sample_rows: int
    targets: int
    target_ctr: float
    history_mean: float
    history_p50: float
    history_p90: float
    history_max: int
    appended_events: int
    path: str


def export_day(home: Path, day: str) -> DayExport:
    import duckdb

    home = Path(home)
    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        _atomic_copy(con, f"select * exclude (sample_date) from training_samples where sample_date = '{day}' "
                          "order by user_id, event_rank", layout.partition(home, layout.TRAINING_SAMPLES, day))
        _atomic_copy(con, f"select * from user_sequences where added_date = '{day}' order by user_id, seq_index",
                     layout.partition(home, layout.USER_SEQUENCES, day))
        following = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
        _atomic_copy(con, f"select * from item_windows where as_of_date = '{following}' order by level, key",
                     layout.partition(home, layout.ITEM_WINDOWS, following))
        stats = con.execute(f"""
            with per_sample as (
                select user_id,
                       count(*) filter (where event_date < sample_date) as history,
                       count(*) filter (where is_target) as targets,
                       sum(label) filter (where is_target) as clicks,
                       count(*) as n
                from training_samples where sample_date = '{day}' group by user_id)
            select count(*), coalesce(sum(n), 0), coalesce(sum(targets), 0), coalesce(sum(clicks), 0),
                   coalesce(avg(history), 0), coalesce(quantile_cont(history, 0.5), 0),
                   coalesce(quantile_cont(history, 0.9), 0), coalesce(max(history), 0)
            from per_sample""").fetchone()
        appended = con.execute(f"select count(*) from user_sequences where added_date = '{day}'").fetchone()[0]
    samples, rows, targets, clicks, mean, p50, p90, mx = stats
    return DayExport(day, int(samples), int(rows), int(targets), float(clicks) / max(int(targets), 1),
                     float(mean), float(p50), float(p90), int(mx), int(appended),
                     str(layout.partition(home, layout.TRAINING_SAMPLES, day)))


def position_bucket_table(home: Path, day: str) -> list[dict]:
    import duckdb

    with duckdb.connect(str(Path(home) / "warehouse.duckdb"), read_only=True) as con:
        df = con.execute(
            f"select surface, position, historical_ctr, historical_impressions, position_bucket "
            f"from position_buckets where as_of_date = '{day}' order by surface, position").df()
    return df.to_dict("records")


def ensure_manifest(project_dir: Path = DBT_PROJECT_DIR) -> Path:
    """target/manifest.json of the dbt project, (re)running `dbt parse` when it is missing or stale."""
    manifest = project_dir / "target" / "manifest.json"
    sources = [p for pattern in ("*.sql", "*.yml") for p in project_dir.rglob(pattern) if "target" not in p.parts]
    if not manifest.exists() or max(p.stat().st_mtime for p in sources) > manifest.stat().st_mtime:
        dbt = Path(sys.executable).with_name("dbt")
        env = {**os.environ, "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}
        subprocess.run([str(dbt), "parse", "--project-dir", str(project_dir), "--profiles-dir", str(project_dir)],
                       check=True, capture_output=True, env=env)
    return manifest


def bucket_ctr_baseline(home: Path, day: str):
    """The per-bucket historical-CTR baseline for D's target impressions.

    Each impression is predicted the impression-weighted historical CTR of its position bucket as of D
    (the trailing window of position_ctr, so nothing of D itself). Columns match models.predict
    with labels: impression_id, user_id, position_bucket, p, label.
    """
    import duckdb

    with duckdb.connect(str(Path(home) / "warehouse.duckdb"), read_only=True) as con:
        df = con.execute(f"""
            with bucket_ctr as (
                select position_bucket,
                       sum(historical_ctr * historical_impressions) / sum(historical_impressions) as ctr
                from position_buckets
                where as_of_date = '{day}' and historical_ctr is not null
                group by position_bucket)
            select t.impression_id, t.user_id, t.position_bucket, b.ctr as p, t.label
            from training_samples t left join bucket_ctr b using (position_bucket)
            where t.sample_date = '{day}' and t.is_target""").df()
    if df.empty or df["p"].isna().all():
        raise ValueError(f"no historical position CTR before {day}: the baseline needs at least one earlier day")
    df["p"] = df["p"].fillna(df["p"].mean())
    return df
