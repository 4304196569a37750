"""The ``events`` job: one landing day D -> one partition of the event lake and of the quarantine.

Inputs (``transforms.landing`` layout under the data root)::

    landing/date=D-1/{impressions,clicks}-*.jsonl.gz   context: D's clicks may belong to D-1's impressions
    landing/date=D/{impressions,clicks,behaviors}-*    owned: every line is accounted for here
    landing/date=D+1/clicks-*.jsonl.gz                 context: late clicks for D's impressions

Outputs::

    lake/events/date=D/part-*.parquet       unified, time-ordered event table (impressions + behaviors)
    lake/quarantine/date=D/part-*.parquet   every rejected line of D's files, raw text kept, with a reason

Ownership and accounting
------------------------
Every line is accounted for by the partition of the *file it is in* (D's files by job D), with exactly
one outcome, so per file kind ``input_lines = accepted + quarantined + duplicates`` holds exactly:

* ``accepted`` — an impression or behavior written to D's event table; or a click that won the
  attribution of an impression of D (reason ``attributed``) or of D-1 (reason
  ``attributed_previous_day``: the late clicks after midnight, which label D-1's partition).
* ``quarantined`` with a reason (raw line kept in the quarantine table):
  ``malformed_json`` (not a JSON object: truncated, invalid, an array),
  ``missing_key`` (a REQUIRED key absent or null; ``detail`` names it),
  ``bad_type`` (an INTEGER_KEYS field that is not a JSON integer fitting a bigint — a numeric
  string, a float, a boolean, a word —, or an id/enum field holding an object or array;
  ``detail`` shows the key and the value),
  ``unknown_enum`` (surface, device, click_type or action outside its domain),
  ``empty_id`` (an id that is empty or whitespace),
  ``position_out_of_range`` (position outside 1..``SURFACE_SLOTS`` of the impression's surface),
  ``ts_out_of_range`` (impression/behavior whose ts_ms is not inside its file's UTC day),
  ``negative_dwell`` (a click's dwell_ms < 0),
  ``orphan_click`` (no accepted impression with that impression_id in the click file's day or the
  day before), ``click_outside_window`` (matched, but not within ``[imp_ts, imp_ts + window]``).
* ``duplicate`` with a reason: ``duplicate_line`` (an exact copy of an earlier valid line of the same
  day and kind; the first copy is kept; identity = two independent hashes + length of the text),
  ``duplicate_impression_id`` (a re-logged impression: the earliest ts_ms wins, ties by file and
  line), ``duplicate_click`` (a second in-window click on an impression: first click wins).

Every single-row rule a blocking events check enforces is one of these row rules, so the event
table never holds a row a check would reject; the checks then judge quarantine *rates*.
Whitespace-only lines (blank lines of JSON Lines) are framing, not records: they are counted as
``blank_lines`` beside the accounting and verified with the file's line count.

Checks run in this order, each on the lines still undecided: parse/validate (all row rules) ->
exact duplicates -> repeated impression_id -> click attribution. Bad lines are never deduplicated (each
copy lands in the quarantine, so the quarantine shows the true volume of garbage).

Click attribution
-----------------
A click line in file-day F may belong to an accepted impression of day F or F-1 only (a click never
precedes its impression, and the window is far below a day). It is attributed when its ts_ms lies in
``[imp_ts, imp_ts + window]`` (default 60 min); among the in-window clicks of one impression the
earliest wins (ties: file day, file, line). The winning click's ``click_type``, ``dwell_ms`` and
ts go onto the impression row with ``label = 1``; impressions without one get ``label = 0``.
Because job D reads D-1's impressions and clicks and D+1's clicks, and every day's validation is a
pure function of that day's files, job D and job D+1 agree on every line they both look at: the
label of a D impression set by a D+1 click (job D) and that click's ``attributed_previous_day``
outcome (job D+1) come from the same rule.

Without D+1 (the newest day, after the grace period the asset decides) clicks after midnight are
missing and D's labels are provisional; ``EventsJobResult.next_day_included`` says so, and a rerun
once D+1 has landed replaces the partition.

Parsing
-------
Lines are read as text (``spark.read.text``, ``lineSep='\\n'``; Hadoop's gzip codec reads
multi-member files; each gzip file is its own Spark partition, so ``line_no`` is exact without a
pre-pass). The record is the line without the JSON whitespace around it, a CR of CRLF endings and a
byte-order mark (``FRAMING``); it is parsed once with ``from_json(record, 'map<string,string>')``:
every top-level key with its value as text (non-ASCII text kept as is). A line is ``malformed_json``
if that fails, if it is not one object ending in ``}``, or if a key repeats. An integer field must be an integer literal that fits a bigint and not a JSON string (a
regex on the raw line tells ``"ts_ms":"123"`` from ``"ts_ms":123``); ids are opaque strings
(integers or strings; an object/array is a ``bad_type``). Unknown extra keys are allowed and
counted (``extra_field``).

Execution: each landing file is read and parsed once, in the pass that also counts its lines (the
counts are checked against ``_SUCCESS`` afterwards; no Python pre-pass decompresses the files). D-1's
impression lines whose impression_id no click of D names are only counted (``context``): they cannot
change an outcome of D, so they skip the parse and the rules. The deduplicated lines are
checkpointed (MEMORY_AND_DISK; raw text only on lines the quarantine may need). Impressions take one
shuffle by (day, impression_id) for both duplicate rules. The clicks are attributed once, into a small
checkpoint of their own, against only the impressions some click names (a broadcast of the clicked ids,
then of those impressions' keys); the counts and both writes read the two checkpoints, and the winners
are broadcast onto the impressions. A file Spark cannot decompress fails the day with a ``LandingError``
naming it (``genrank landing quarantine-file`` releases the day).

**Checkpoints, not caches.** A local checkpoint is a cache whose frame forgets how it was computed:
the frames built on it (attribution, the counts, both writes) are analysed and planned over two small
leaves instead of over the whole parse, rules and deduplication plan, which Spark re-analyses for every
frame derived from it. That analysis was most of a day's fixed cost: a warm tiny-world day (~2k lines,
local[2], 2 quiet cores) took 4.85 s instead of 9.95 s, x53 Spark's own ``from_json`` floor instead of
x98 (``benchmarks/spark_aggregation.py --preset tiny``; benchmarks/RESULTS.md, "A day's fixed cost").
The price is on a cluster: blocks lost with an executor cannot be recomputed, so the job fails instead
of redoing part of it, and the daily run's retry reruns the step (the same path as a lost cluster, see
``transforms/spark/session``). Both checkpoints are released when the day ends (:func:`_release`), as
the caches were.

Writes are atomic: each table is written into a hidden ``.tmp-date=D-*`` sibling and renamed over
``date=D`` (the previous version is moved aside first and deleted after), so a rerun of D replaces D
exactly and a crash mid-write leaves the old partition (or none), never half of one. This relies on
a POSIX rename, i.e. a local or HDFS-like data root.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

import contracts
from contracts import ACTIONS, CLICK_TYPES, DAY_MS, layout
from transforms import landing
from transforms.atomic import staged_dir
from transforms.landing import DEVICES, FILE_KINDS, INTEGER_KEYS, OPTIONAL_KEYS, REQUIRED_KEYS, SURFACE_SLOTS, SURFACES
from transforms.spark.session import shrink_driver_heap

ID_KEYS = ("request_id", "impression_id", "user_id", "ad_id", "campaign_id", "advertiser_id",
           "category_id", "brand_id", "item_id")
ENUM_KEYS: dict[str, tuple[str, ...]] = {
    "surface": SURFACES, "device": DEVICES, "click_type": CLICK_TYPES, "action": ACTIONS,
}
ALL_KEYS = tuple(dict.fromkeys(k for kind in FILE_KINDS for k in REQUIRED_KEYS[kind] + OPTIONAL_KEYS[kind]))

ACCEPTED, QUARANTINED, DUPLICATE, BLANK = "accepted", "quarantined", "duplicate", "blank"
# Lines of the day before's impressions that no click of D names: they cannot change any outcome of
# D's lines, so they are only counted (per file), never parsed, deduplicated or cached with fields.
CONTEXT = "context"
# Row rules, in the order they are decided (a line gets the first that applies).
QUARANTINE_REASONS = ("malformed_json", "missing_key", "bad_type", "unknown_enum", "empty_id",
                      "position_out_of_range", "ts_out_of_range", "negative_dwell",
                      "orphan_click", "click_outside_window")

# The event table's schema (contracts.EVENT_COLUMNS) as Spark SQL types.
EVENT_COLUMNS: dict[str, str] = contracts.spark_columns()
QUARANTINE_COLUMNS: dict[str, str] = {
    "kind": "string", "source_file": "string", "line_no": "bigint", "reason": "string",
    "detail": "string", "raw": "string",
}


class AccountingError(RuntimeError):
    """Row accounting did not close (a bug, never expected): the message has the numbers."""


@dataclass(frozen=True)
class SourceFile:
    day: str
    kind: str
    path: str


# --------------------------------------------------------------------------------------------
# Pure DataFrame -> DataFrame steps
# --------------------------------------------------------------------------------------------

def read_lines(spark: SparkSession, sources: Sequence[SourceFile]) -> DataFrame:
    """Text lines of the given landing files: src_day, kind, source_file, line_no (1-based), raw.

    Requires one file per Spark partition (gzip is not splittable, and ``run_events_job`` raises
    ``spark.sql.files.openCostInBytes`` so small files are never packed together): the lower 33 bits
    of ``monotonically_increasing_id`` are then the row index inside the file. ``ledger_counts``
    re-checks this (max line_no == line count per file).
    """
    if not sources:
        raise ValueError("no landing files to read")
    parts = []
    for kind in FILE_KINDS:  # one read per kind, so a kind's parse never scans the other kinds' files
        paths = sorted({os.path.abspath(s.path) for s in sources if s.kind == kind})
        if not paths:
            continue
        df = spark.read.option("lineSep", "\n").text(paths)
        path_col = F.col("_metadata.file_path")
        parts.append(df.select(
            F.regexp_extract(path_col, r"date=(\d{4}-\d{2}-\d{2})/[^/]+$", 1).alias("src_day"),
            F.lit(kind).alias("kind"),
            F.regexp_extract(path_col, r"(date=[^/]+/[^/]+)$", 1).alias("source_file"),
            (F.monotonically_increasing_id().bitwiseAND(F.lit((1 << 33) - 1)) + 1).alias("line_no"),
            F.col("value").alias("raw"),
        ))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def set_aside_unclicked(lines: DataFrame, day: str) -> DataFrame:
    """Add ``context``: true on the lines of D-1's impression files whose impression_id no click line
    of D names.

    Job D needs D-1's impressions only as the targets of D's late clicks (and of D-1's clicks that
    compete with them for the same impression), so an impression no click of D names cannot change
    an outcome of D. The test is ``get_json_object`` on the framed record, which reads an id as the
    parse's map does (a string unescaped, a number as its JSON text); a line it keeps gets every rule,
    a line it sets aside is only counted. D's click ids come from a broadcast of D's few click lines.
    """
    body = F.btrim("raw", F.lit(FRAMING))
    named = (lines.filter((F.col("kind") == "clicks") & (F.col("src_day") == day))
             .select(F.element_at(F.from_json(body, "map<string,string>"), F.lit("impression_id")).alias("named_id"))
             .filter(F.col("named_id").isNotNull()).distinct())
    prev = (F.col("kind") == "impressions") & (F.col("src_day") < day)
    probe = F.when(prev, F.get_json_object(body, "$.impression_id"))
    out = lines.withColumn("_probe", probe).join(F.broadcast(named), F.col("_probe") == F.col("named_id"), "left")
    return out.withColumn("context", prev & F.col("named_id").isNull()).drop("_probe", "named_id")


def _first(pairs):
    """CASE WHEN c1 THEN v1 WHEN c2 THEN v2 ... END (null when none holds)."""
    expr = None
    for cond, value in pairs:
        expr = F.when(cond, value) if expr is None else expr.when(cond, value)
    return expr


INT_TEXT = r"^-?[0-9]{1,19}$"


# JSON whitespace around an object, a CR left by CRLF endings and a UTF-8 byte-order mark are not
# part of the record (RFC 8259 / JSON Lines); the raw line is kept untouched for the quarantine.
FRAMING = " \t\r\ufeff"


def _parse_kind(lines: DataFrame, k_name: str) -> DataFrame:
    """Validate the lines of one file kind (one kind per projection keeps generated code small).

    One Jackson parse per line: ``from_json(body, 'map<string,string>')`` gives every top-level key
    with its value as text (numbers, booleans and nested values as their JSON text, strings
    unquoted). An integer field must have an integer literal as text *and* must not be a JSON
    string (a regex on the line tells ``"ts_ms": "123"`` from ``"ts_ms": 123``). Every rule a
    blocking events check enforces on one row is decided here, each with its own reason.
    """
    keys = REQUIRED_KEYS[k_name] + OPTIONAL_KEYS[k_name]
    df = lines.filter((F.col("kind") == k_name) & ~F.col("context")).withColumn("body", F.btrim("raw", F.lit(FRAMING)))
    df = df.withColumn("m", F.from_json("body", "map<string,string>"))
    m = F.col("m")
    # Extract every value once into its own column: the checks below reference each several times.
    df = df.select("*", *[F.element_at(m, F.lit(k)).alias(f"x_{k}") for k in keys])
    text = {k: F.col(f"x_{k}") for k in keys}

    def problem(reason: str, detail):
        return F.struct(F.lit(reason).alias("reason"), (F.lit(detail) if isinstance(detail, str) else detail).alias("detail"))

    blank = F.length("body") == 0
    malformed = (m.isNull() | ~F.col("body").endswith("}")
                 | (F.size(F.map_keys(m)) != F.size(F.array_distinct(F.map_keys(m)))))
    checks: list[tuple] = [(malformed, problem("malformed_json", "not a single JSON object"))]
    for key in REQUIRED_KEYS[k_name]:
        checks.append((text[key].isNull(), problem("missing_key", key)))
    for key in keys:
        if key in INTEGER_KEYS[k_name]:
            quoted = F.col("body").rlike(f'"{key}"\\s*:\\s*"')
            wrong = quoted | ~text[key].rlike(INT_TEXT) | text[key].try_cast("bigint").isNull()
            shown = F.when(quoted, F.concat(F.lit('"'), text[key], F.lit('"'))).otherwise(text[key])
        else:  # ids and enums: scalars only (ids are opaque strings; enums are checked by domain below)
            wrong = F.substring(text[key], 1, 1).isin("{", "[")
            shown = text[key]
        checks.append((text[key].isNotNull() & wrong,
                       problem("bad_type", F.concat(F.lit(f"{key}="), F.substring(shown, 1, 40)))))
    for key in REQUIRED_KEYS[k_name]:
        if key in ENUM_KEYS:
            checks.append((~text[key].isin(*ENUM_KEYS[key]), problem("unknown_enum", F.concat(F.lit(f"{key}="), text[key]))))
        elif key in ID_KEYS:
            checks.append((F.length(F.trim(text[key])) == 0, problem("empty_id", key)))
    if k_name == "impressions":
        slots = _first((text["surface"] == s, F.lit(n)) for s, n in SURFACE_SLOTS.items())
        position = text["position"].cast("bigint")
        checks.append(((position < 1) | (position > slots), problem(
            "position_out_of_range", F.concat(F.lit("position="), text["position"], F.lit(" on "), text["surface"],
                                              F.lit(" (slots 1.."), slots.cast("string"), F.lit(")")))))
    if k_name != "clicks":  # a click's time is judged against its impression (attribution window)
        start = day_start_col(F.col("src_day"))
        ts = text["ts_ms"].cast("bigint")
        checks.append(((ts < start) | (ts >= start + F.lit(DAY_MS)), problem(
            "ts_out_of_range", F.concat(F.lit("ts_ms="), text["ts_ms"], F.lit(" outside "), F.col("src_day")))))
    if k_name == "clicks":
        checks.append((text["dwell_ms"].cast("bigint") < 0, problem("negative_dwell", F.concat(F.lit("dwell_ms="), text["dwell_ms"]))))
    verdict = F.when(blank, problem("blank_line", F.lit(None).cast("string"))).otherwise(_first(checks))

    typed = []
    for key in ALL_KEYS:
        if key not in keys:
            typed.append(F.lit(None).cast(_key_type(key)).alias(key))
        elif key in INTEGER_KEYS[k_name] or key == "position":
            typed.append(text[key].try_cast(_key_type(key)).alias(key))
        else:
            typed.append(text[key].alias(key))
    known = F.array(*[F.lit(k) for k in keys])
    has_extra = F.coalesce(F.size(F.array_except(F.map_keys(m), known)) > 0, F.lit(False))
    df = df.select("src_day", "kind", "source_file", "line_no", "raw", "body", *typed,
                   has_extra.alias("has_extra"), verdict.alias("_verdict"))
    # The raw text is kept only where the quarantine may need it (rejected lines, and clicks, which
    # attribution can still reject): the checkpointed frame stays small. Line identity for exact
    # duplicates is (xxhash64, murmur3, length) of the text.
    rejected = F.col("_verdict").isNotNull() & ~blank
    return df.select(
        "src_day", "kind", "source_file", "line_no",
        F.when(rejected | F.lit(k_name == "clicks"), F.col("raw")).alias("raw"),
        F.xxhash64("raw").alias("_h1"), F.hash("raw").alias("_h2"), F.length("raw").alias("_len"),
        *ALL_KEYS, "has_extra",
        F.when(blank, F.lit(BLANK)).when(rejected, F.lit(QUARANTINED)).alias("outcome"),
        F.col("_verdict.reason").alias("reason"),
        F.col("_verdict.detail").alias("detail"),
    )


def _key_type(key: str) -> str:
    return "bigint" if key in ("ts_ms", "dwell_ms") else "int" if key == "position" else "string"


def parse_lines(lines: DataFrame) -> DataFrame:
    """Parse and validate every line against the landing contract of its kind.

    Adds the typed fields of all kinds (ids as strings), ``has_extra`` and, for invalid lines,
    ``outcome='quarantined'`` with ``reason``/``detail``; valid lines get ``outcome = null`` (pending).
    Reason precedence: malformed_json > missing_key > bad_type > bad_value (first key in contract order).
    Lines ``set_aside_unclicked`` marked ``context`` are not parsed: they get ``outcome='context'``.
    """
    context = lines.filter(F.col("context")).select(
        "src_day", "kind", "source_file", "line_no", F.lit(None).cast("string").alias("raw"),
        F.lit(None).cast("bigint").alias("_h1"), F.lit(None).cast("int").alias("_h2"), F.lit(None).cast("int").alias("_len"),
        *[F.lit(None).cast(_key_type(k)).alias(k) for k in ALL_KEYS], F.lit(False).alias("has_extra"),
        F.lit(CONTEXT).alias("outcome"), *[F.lit(None).cast("string").alias(c) for c in ("reason", "detail")])
    parts = [_parse_kind(lines, k) for k in FILE_KINDS] + [context]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _pending():
    return F.col("outcome").isNull()


def _decide(df: DataFrame, cond, outcome: str, reason, detail=None) -> DataFrame:
    """Set outcome/reason/detail on pending rows where ``cond`` holds."""
    hit = _pending() & cond
    return (df.withColumn("reason", F.when(hit, reason if not isinstance(reason, str) else F.lit(reason)).otherwise(F.col("reason")))
              .withColumn("detail", F.when(hit, detail if detail is not None else F.lit(None).cast("string")).otherwise(F.col("detail")))
              .withColumn("outcome", F.when(hit, F.lit(outcome)).otherwise(F.col("outcome"))))


def mark_duplicates(df: DataFrame, shuffle_partitions: int) -> DataFrame:
    """Exact copies of an earlier valid line -> duplicate_line (the first copy is kept); then a re-logged
    impression_id of the day -> duplicate_impression_id (the earliest ts_ms wins; ties: file, line).

    Impressions are hash-partitioned once by (src_day, impression_id): exact copies share their
    impression_id, so both windows run on that one shuffle. Clicks and behaviors need the copy rule
    only. A false merge needs both hashes to collide among lines of equal length (~n^2 / 2^97).
    Invalid lines take part in neither rule (each copy of garbage is quarantined and counted).
    """
    ok = _pending()
    copy_w = ["src_day", "kind", ok, "_h1", "_h2", "_len"]
    context = F.col("outcome").eqNullSafe(CONTEXT)
    imps = df.filter((F.col("kind") == "impressions") & ~context).repartition(shuffle_partitions, "src_day", "impression_id")
    imps = imps.withColumn("_copy", ok & (F.row_number().over(
        Window.partitionBy("src_day", "impression_id", *copy_w[1:]).orderBy("source_file", "line_no")) > 1))
    first = Window.partitionBy("src_day", "impression_id", ok, "_copy").orderBy("ts_ms", "source_file", "line_no")
    imps = imps.withColumn("_relog", ok & ~F.col("_copy") & (F.row_number().over(first) > 1))
    others = df.filter(F.col("kind") != "impressions")
    others = others.withColumn("_copy", ok & (F.row_number().over(
        Window.partitionBy(*copy_w).orderBy("source_file", "line_no")) > 1)).withColumn("_relog", F.lit(False))
    aside = df.filter(context).withColumn("_copy", F.lit(False)).withColumn("_relog", F.lit(False))
    out = _decide(imps.unionByName(others).unionByName(aside), F.col("_copy"), DUPLICATE, "duplicate_line")
    return _decide(out, F.col("_relog"), DUPLICATE, "duplicate_impression_id").drop("_copy", "_relog", "_h1", "_h2", "_len")


def day_start_col(day_col):
    """UTC epoch ms of the start of the day in a 'YYYY-MM-DD' column."""
    return F.unix_date(F.to_date(day_col)).cast("bigint") * F.lit(DAY_MS)


def accept_pending(df: DataFrame) -> DataFrame:
    """Impressions and behaviors still pending are accepted events."""
    return _decide(df, F.col("kind") != "clicks", ACCEPTED, "event")


def attribute_clicks(df: DataFrame, window_ms: int) -> DataFrame:
    """Resolve every pending click against the accepted impressions (see module docstring).

    Input: the frame after ``accept_pending``. Output: the pending clicks only, decided, plus
    ``imp_day`` (day of the matched impression, null when none); ``with_clicks`` puts them back.
    Only the impressions whose id some click names take part (a broadcast semi-join of the few
    clicked ids), so the join and both windows run on click-sized data, never on the day's impressions.
    """
    clicks = df.filter((F.col("kind") == "clicks") & _pending())
    clicked_ids = clicks.select(F.col("impression_id").alias("c_impression_id")).distinct()
    imps = df.filter((F.col("kind") == "impressions") & (F.col("outcome") == ACCEPTED)).select(
        F.col("impression_id").alias("m_impression_id"),
        F.col("src_day").alias("imp_day"),
        F.col("ts_ms").alias("imp_ts"),
    )
    imps = imps.join(F.broadcast(clicked_ids), F.col("m_impression_id") == F.col("c_impression_id"), "left_semi")
    same_or_prev = (F.col("imp_day") == F.col("src_day")) | (
        F.to_date("imp_day") == F.date_sub(F.to_date("src_day"), 1))
    cand = clicks.join(F.broadcast(imps), (F.col("impression_id") == F.col("m_impression_id")) & same_or_prev, "left")
    in_window = (F.col("imp_ts").isNotNull() & (F.col("ts_ms") >= F.col("imp_ts"))
                 & (F.col("ts_ms") <= F.col("imp_ts") + F.lit(window_ms)))
    cand = cand.withColumn("_in", F.coalesce(in_window, F.lit(False)))
    # One candidate impression per click line (ids are unique per day; this only breaks the rare
    # tie of an impression_id re-used on two consecutive days): prefer in-window, then the newer day.
    one = Window.partitionBy("source_file", "line_no").orderBy(F.col("_in").desc(), F.col("imp_day").desc_nulls_last())
    cand = cand.withColumn("_c", F.row_number().over(one)).filter(F.col("_c") == 1).drop("_c")
    first = Window.partitionBy("imp_day", "impression_id", "_in").orderBy("ts_ms", "src_day", "source_file", "line_no")
    cand = cand.withColumn("_rank", F.when(F.col("_in"), F.row_number().over(first)))

    minutes = F.format_number((F.col("ts_ms") - F.col("imp_ts")) / F.lit(60_000.0), 1)
    cand = _decide(cand, F.col("imp_ts").isNull(), QUARANTINED, "orphan_click",
                   F.lit("no accepted impression with this impression_id on this day or the day before"))
    cand = _decide(cand, ~F.col("_in"), QUARANTINED, "click_outside_window",
                   F.concat(F.lit("click at "), minutes, F.lit(f" min from its impression (window {window_ms / 60000:g} min)")))
    cand = _decide(cand, F.col("_rank") > 1, DUPLICATE, "duplicate_click",
                   F.lit("a later click on an impression that already has an attributed click"))
    cand = _decide(cand, F.col("_rank") == 1, ACCEPTED,
                   F.when(F.col("imp_day") == F.col("src_day"), F.lit("attributed")).otherwise(F.lit("attributed_previous_day")))
    cand = cand.withColumn("imp_day", F.when(F.col("outcome") == ACCEPTED, F.col("imp_day")))
    return cand.drop("m_impression_id", "imp_ts", "_in", "_rank")


def with_clicks(decided: DataFrame, clicks: DataFrame) -> DataFrame:
    """Every line decided: ``decided`` with its pending clicks replaced by ``attribute_clicks``' output."""
    rest = decided.filter(~((F.col("kind") == "clicks") & _pending())).withColumn("imp_day", F.lit(None).cast("string"))
    return rest.unionByName(clicks)


def decide_lines(parsed: DataFrame, shuffle_partitions: int = 4) -> DataFrame:
    """Dedup and acceptance of impressions/behaviors; clicks stay pending (attribution decides them).

    The job checkpoints this frame: attribution, the counts and both writes all read it.
    """
    return accept_pending(mark_duplicates(parsed, shuffle_partitions))


def build_events(resolved: DataFrame, day: str) -> DataFrame:
    """D's unified event table: accepted impressions (labelled) and behaviors, in time order."""
    mine = resolved.filter((F.col("src_day") == day) & (F.col("outcome") == ACCEPTED))
    winners = resolved.filter((F.col("kind") == "clicks") & (F.col("outcome") == ACCEPTED) & (F.col("imp_day") == day)).select(
        F.col("impression_id").alias("w_impression_id"),
        F.col("click_type").alias("w_click_type"),
        F.col("dwell_ms").alias("w_dwell_ms"),
        F.col("ts_ms").alias("w_ts_ms"),
    )
    # winners are at most one click per impression (a few % of them): broadcast, no wide shuffle
    imps = mine.filter(F.col("kind") == "impressions").join(
        F.broadcast(winners), F.col("impression_id") == F.col("w_impression_id"), "left")
    imps = imps.select(
        F.lit("impression").alias("event_kind"), "user_id", "ts_ms", "request_id", "impression_id",
        F.col("ad_id").alias("item_id"), "ad_id", "campaign_id", "advertiser_id", "category_id", "brand_id",
        "position", "surface", "device", F.lit(None).cast("string").alias("action"),
        F.when(F.col("w_impression_id").isNotNull(), 1).otherwise(0).alias("label"),
        F.col("w_click_type").alias("click_type"), F.col("w_dwell_ms").alias("dwell_ms"),
        F.col("w_ts_ms").alias("click_ts_ms"),
    )
    behaviors = mine.filter(F.col("kind") == "behaviors").select(
        F.lit("behavior").alias("event_kind"), "user_id", "ts_ms",
        F.lit(None).alias("request_id"), F.lit(None).alias("impression_id"), "item_id",
        F.lit(None).alias("ad_id"), F.lit(None).alias("campaign_id"), F.lit(None).alias("advertiser_id"),
        "category_id", "brand_id", F.lit(None).alias("position"), F.lit(None).alias("surface"),
        F.lit(None).alias("device"), "action", F.lit(None).alias("label"), F.lit(None).alias("click_type"),
        F.lit(None).alias("dwell_ms"), F.lit(None).alias("click_ts_ms"),
    )
    cols = [F.col(c).cast(t).alias(c) for c, t in EVENT_COLUMNS.items()]
    return imps.select(*cols).unionByName(behaviors.select(*cols))


def build_quarantine(resolved: DataFrame, day: str) -> DataFrame:
    """D's rejected lines with reason, detail, source file, line number and the raw text."""
    q = resolved.filter((F.col("src_day") == day) & (F.col("outcome") == QUARANTINED))
    return q.select(*[F.col(c).cast(t).alias(c) for c, t in QUARANTINE_COLUMNS.items()])


def ledger_counts(resolved: DataFrame) -> DataFrame:
    """(src_day, kind, source_file, outcome, reason, imp_day) -> lines, max_line_no, extra_field."""
    return resolved.groupBy("src_day", "kind", "source_file", "outcome", "reason", "imp_day").agg(
        F.count(F.lit(1)).alias("lines"),
        F.max("line_no").alias("max_line_no"),
        F.sum(F.when(F.col("has_extra") & (F.col("outcome") == ACCEPTED), 1).otherwise(0)).alias("extra_field"),
    )


# --------------------------------------------------------------------------------------------
# Job entry
# --------------------------------------------------------------------------------------------

@dataclass
class KindAccount:
    input_lines: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    accepted_by_reason: dict[str, int] = field(default_factory=dict)
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    duplicates_by_reason: dict[str, int] = field(default_factory=dict)
    extra_field: int = 0
    blank_lines: int = 0    # whitespace-only lines: valid JSON Lines framing, not records, not input lines

    @property
    def closes(self) -> bool:
        return self.input_lines == self.accepted + self.quarantined + self.duplicates


@dataclass
class EventsJobResult:
    day: str
    events_path: str
    quarantine_path: str
    accounting: dict[str, KindAccount]
    events_rows: int
    impressions: int
    behaviors: int
    clicked_impressions: int
    previous_day_included: bool
    next_day_included: bool
    attribution_window_min: float
    lines_read: int
    duration_s: float
    # source_file -> {"kind", "lines" (records, blank lines excluded), "quarantined"} for D's files
    files: dict[str, dict] = field(default_factory=dict)
    source_declared_empty: bool = False
    quarantined_files: list[dict] = field(default_factory=list)   # set aside by an operator (landing ledger)

    @property
    def ctr(self) -> float | None:
        return self.clicked_impressions / self.impressions if self.impressions else None

    def _total(self, field_name: str) -> int:
        return sum(getattr(a, field_name) for a in self.accounting.values())

    # D's lines over every kind (context lines of D-1/D+1 not counted)
    input_lines = property(lambda self: self._total("input_lines"))
    quarantined = property(lambda self: self._total("quarantined"))
    duplicates = property(lambda self: self._total("duplicates"))
    accepted = property(lambda self: self._total("accepted"))

    @property
    def rows_per_s(self) -> float:
        """Input lines of day D per second of job wall time (context lines of D-1/D+1 not counted)."""
        return self.input_lines / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def accounting_closes(self) -> bool:
        return all(a.closes for a in self.accounting.values())

    def _by_reason(self, field_name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.accounting.values():
            for r, n in getattr(a, field_name).items():
                out[r] = out.get(r, 0) + n
        return dict(sorted(out.items()))

    def quarantine_by_reason(self) -> dict[str, int]:
        return self._by_reason("quarantined_by_reason")

    def duplicates_by_reason(self) -> dict[str, int]:
        return self._by_reason("duplicates_by_reason")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ctr=self.ctr, rows_per_s=self.rows_per_s, input_lines=self.input_lines,
                 accepted=self.accepted, quarantined=self.quarantined, duplicates=self.duplicates,
                 accounting_closes=self.accounting_closes)
        return d

    def summary(self) -> str:
        parts = [f"events {self.day}: {self.input_lines} lines -> {self.accepted} accepted, "
                 f"{self.quarantined} quarantined, {self.duplicates} duplicates"]
        for kind, a in self.accounting.items():
            parts.append(f"  {kind}: in={a.input_lines} acc={a.accepted} {a.accepted_by_reason} "
                         f"q={a.quarantined} {a.quarantined_by_reason} dup={a.duplicates} {a.duplicates_by_reason}")
        for entry in self.quarantined_files:
            parts.append(f"  file set aside by an operator: {entry['file']} ({entry['declared_lines']} declared lines): {entry['reason']}")
        if self.source_declared_empty:
            parts.append("  the source declares this day empty (_SUCCESS lists zero lines)")
        ctr = f"{self.ctr:.4f}" if self.ctr is not None else "n/a"
        parts.append(f"  events={self.events_rows} impressions={self.impressions} ctr={ctr} "
                     f"{self.duration_s:.1f}s {self.rows_per_s:,.0f} lines/s")
        return "\n".join(parts)


def _checkpoint(df: DataFrame) -> DataFrame:
    """``df`` computed now into the executors' block storage (memory, spilling to disk), as a frame over that
    data alone (see "Checkpoints, not caches" above)."""
    return df.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


def _release(checkpointed: DataFrame) -> None:
    """Free a checkpoint's blocks now. ``DataFrame.unpersist`` does not reach them (it uncaches plans, and a
    checkpoint is no cached plan), and Spark's cleaner would only free them once the JVM collects the RDD,
    which a long-lived session running day after day may not do for a long while."""
    checkpointed._jdf.queryExecution().logical().rdd().unpersist(True)


def _context_day(home: Path, day: str) -> landing.LandingDay | None:
    """A neighbouring landing day if it is complete; None if absent or not yet complete."""
    if not landing.is_complete(home, day):
        return None
    return landing.open_day(home, day, verify=False)


def _read_error(exc: Exception, sources: Sequence[SourceFile]) -> landing.LandingError | None:
    """Spark's failure to decompress a landing file as a LandingError naming the file (else None)."""
    text = str(exc)
    for src in sources:
        if os.path.abspath(src.path) in text:
            return landing.LandingError(f"{src.path}: corrupt gzip (Spark could not read it: "
                                        f"{text.splitlines()[0][:300]}); {landing.RELEASE_HINT}")
    return None


def _clean_spark_files(path: Path) -> None:
    """Drop Spark's checksum/marker files and name the parts ``part-00000.parquet``, ... in order."""
    for p in path.iterdir():
        if (p.name.startswith(".") and p.name.endswith(".crc")) or p.name == "_SUCCESS":
            p.unlink()
    for i, p in enumerate(sorted(path.glob("part-*.parquet"))):
        p.rename(path / f"part-{i:05d}.parquet")


def write_partition(df: DataFrame, base: Path, day: str, sort_cols: Sequence[str] | None = None, files: int = 1) -> Path:
    """Write ``df`` as ``base/date=day`` atomically (temp dir + rename); returns the final path."""
    final = layout.day_dir(base, day)
    with staged_dir(final) as tmp:
        out = df.repartition(files)
        if sort_cols:
            out = out.sortWithinPartitions(*sort_cols)
        out.write.mode("overwrite").parquet(str(tmp))   # into the (empty) staging directory
        _clean_spark_files(tmp)
    return final


# Session settings the job relies on (set for the job's duration, then restored).
JOB_CONF = {
    # one gzip file per Spark partition, so line numbers come from monotonically_increasing_id
    "spark.sql.files.openCostInBytes": str(1 << 40),
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",   # repeated JSON keys are flagged, never an exception
}

EVENT_SORT = ("ts_ms", "user_id", "event_kind", "impression_id", "item_id", "action")


def day_sources(home: Path, day: str, use_next_day: bool = True, require_next_day: bool = False
                ) -> tuple[landing.LandingDay, landing.LandingDay | None, landing.LandingDay | None, list[SourceFile]]:
    """The landing days job D reads (D, and D-1 and D+1 where complete) and its files: D's, D-1's impressions
    and clicks, D+1's clicks (``run_events_job`` documents the two flags)."""
    current = landing.open_day(home, day, verify=False)
    previous = _context_day(home, landing.shift_day(day, -1))
    nxt = None
    if use_next_day:
        nxt = _context_day(home, landing.shift_day(day, 1))
        if nxt is None and require_next_day:
            raise landing.LandingError(
                f"landing day {landing.shift_day(day, 1)} is not complete: the events job for {day} needs it for late clicks")

    sources: list[SourceFile] = []
    for kind in FILE_KINDS:
        sources += [SourceFile(day, kind, str(p)) for p in current.files[kind]]
    if previous is not None:
        for kind in ("impressions", "clicks"):
            sources += [SourceFile(previous.day, kind, str(p)) for p in previous.files[kind]]
    if nxt is not None:
        sources += [SourceFile(nxt.day, "clicks", str(p)) for p in nxt.files["clicks"]]
    return current, previous, nxt, sources


def run_events_job(
    spark: SparkSession,
    home: str | os.PathLike,
    day: str | dt.date,
    attribution_window_min: float = 60,
    require_next_day: bool = False,
    use_next_day: bool = True,
    verify_landing: bool = True,
    events_files: int = 1,
) -> EventsJobResult:
    """Run the events job for one day (see the module docstring for the rules).

    * ``require_next_day``: raise ``LandingError`` if D+1 is not complete (otherwise D+1 is used when
      complete and skipped when not — the asset applies the grace period).
    * ``use_next_day=False`` ignores D+1 even when present (tests, replays).
    * ``verify_landing``: every file of D must hold the line count ``_SUCCESS`` declares, as Spark
      counted it in the same pass that parses it (no separate decompression pass).
    """
    t0 = time.perf_counter()
    home = Path(home)
    day = day if isinstance(day, str) else day.isoformat()
    current, previous, nxt, sources = day_sources(home, day, use_next_day, require_next_day)

    accounting = {kind: KindAccount() for kind in FILE_KINDS}
    files: dict[str, dict] = {}
    lines_read = clicked = 0
    lake = layout.lake(home)
    if not any(current.files.values()):  # a source-declared empty day without files: nothing to read
        empty = spark.createDataFrame([], ", ".join(f"{c} {t}" for c, t in EVENT_COLUMNS.items()))
        events_path = write_partition(empty, lake / layout.EVENTS, day)
        quarantine_path = write_partition(
            spark.createDataFrame([], ", ".join(f"{c} {t}" for c, t in QUARANTINE_COLUMNS.items())), lake / layout.EVENTS_QUARANTINE, day)
    else:
        window_ms = int(round(attribution_window_min * 60_000))
        saved = {k: spark.conf.get(k, None) for k in JOB_CONF}
        for k, v in JOB_CONF.items():
            spark.conf.set(k, v)
        decided = clicks = None
        try:
            # Each file is read and parsed once, into the checkpointed ``decided`` (the only action that
            # reads the landing files); the clicks are attributed once, into their own small checkpoint;
            # the counts and both writes read the two checkpoints.
            try:
                decided = _checkpoint(decide_lines(parse_lines(set_aside_unclicked(read_lines(spark, sources), day)),
                                                   int(spark.conf.get("spark.sql.shuffle.partitions"))))
            except Exception as exc:  # a file Spark cannot decompress fails the day naming the file
                raise (_read_error(exc, sources) or exc) from exc
            clicks = _checkpoint(attribute_clicks(decided, window_ms))
            resolved = with_clicks(decided, clicks)
            counts = ledger_counts(resolved).collect()
            lines_read, clicked = _account(counts, day, accounting, files)
            if verify_landing:
                _check_declared_counts(current, files)
            events_path = write_partition(build_events(resolved, day), lake / layout.EVENTS, day, EVENT_SORT, events_files)
            quarantine_path = write_partition(build_quarantine(resolved, day), lake / layout.EVENTS_QUARANTINE, day,
                                              ("kind", "source_file", "line_no"), 1)
        finally:
            for frame in (clicks, decided):
                if frame is not None:
                    _release(frame)
            shrink_driver_heap(spark)
            for k, v in saved.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)

    impressions = accounting["impressions"].accepted
    behaviors = accounting["behaviors"].accepted
    return EventsJobResult(
        day=day,
        events_path=str(events_path),
        quarantine_path=str(quarantine_path),
        accounting=accounting,
        events_rows=impressions + behaviors,
        impressions=impressions,
        behaviors=behaviors,
        clicked_impressions=clicked,
        previous_day_included=previous is not None,
        next_day_included=nxt is not None,
        attribution_window_min=float(attribution_window_min),
        lines_read=lines_read,
        duration_s=time.perf_counter() - t0,
        files=files,
        source_declared_empty=current.declared_empty,
        quarantined_files=current.quarantined_files,
    )


def _account(counts, day: str, accounting: dict[str, KindAccount], files: dict[str, dict]) -> tuple[int, int]:
    """Fold the ledger rows into per-kind and per-file accounting of D; returns (lines read, clicked).

    Raises AccountingError if line numbers are not exact or a kind's accounting does not close.
    """
    clicked = 0
    per_file: dict[str, list[int]] = {}
    for r in counts:
        f = per_file.setdefault(r["source_file"], [0, 0])
        f[0] += r["lines"]
        f[1] = max(f[1], r["max_line_no"] or 0)
        if r["outcome"] == ACCEPTED and r["kind"] == "clicks" and r["imp_day"] == day:
            clicked += r["lines"]
        if r["src_day"] != day:
            continue
        a = accounting[r["kind"]]
        n = r["lines"]
        mine = files.setdefault(r["source_file"], {"kind": r["kind"], "lines": 0, "blank_lines": 0, "quarantined": 0})
        if r["outcome"] == BLANK:
            a.blank_lines += n
            mine["blank_lines"] += n
            continue
        bucket = {ACCEPTED: a.accepted_by_reason, QUARANTINED: a.quarantined_by_reason,
                  DUPLICATE: a.duplicates_by_reason}[r["outcome"]]
        bucket[r["reason"]] = bucket.get(r["reason"], 0) + n
        a.extra_field += r["extra_field"]
        a.input_lines += n
        mine["lines"] += n
        mine["quarantined"] += n if r["outcome"] == QUARANTINED else 0
    packed = {f: v for f, v in per_file.items() if v[0] != v[1]}
    if packed:
        raise AccountingError(f"line numbers are not exact (several files in one Spark partition?): {packed}")
    for kind, a in accounting.items():
        a.accepted = sum(a.accepted_by_reason.values())
        a.quarantined = sum(a.quarantined_by_reason.values())
        a.duplicates = sum(a.duplicates_by_reason.values())
        for bucket in (a.accepted_by_reason, a.quarantined_by_reason, a.duplicates_by_reason):
            items = sorted(bucket.items())
            bucket.clear()
            bucket.update(items)
        if not a.closes:
            raise AccountingError(
                f"{day} {kind}: {a.input_lines} input lines != {a.accepted} accepted + {a.quarantined} quarantined + {a.duplicates} duplicates")
    return sum(n for n, _ in per_file.values()), clicked


def _check_declared_counts(current: landing.LandingDay, files: dict[str, dict]) -> None:
    """Every file of D holds the lines _SUCCESS declares (Spark's count: records + blank lines)."""
    for kind in FILE_KINDS:
        for path in current.files[kind]:
            name = path.name
            got = files.get(f"{layout.PARTITION_PREFIX}{current.day}/{name}", {})
            n = got.get("lines", 0) + got.get("blank_lines", 0)
            if name in current.declared and current.declared[name] != n:
                raise landing.LandingError(f"{path}: {n} lines but {landing.SUCCESS_MARKER} declares {current.declared[name]}")
