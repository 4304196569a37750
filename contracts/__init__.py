"""The shapes every genrank package agrees on, in one place and with no dependency at all (not even numpy),
so that the landing parser, the Spark job, the dbt models' readers, the models package, the service and the
tests import the same names instead of writing them out again. The layer below every package
(tests/test_layering.py): it imports nothing of genrank. Beside this module: `layout` (where the landing zone
and each lake dataset keep a day) and `settings` (every configuration variable, the one reader of the environment).

A change here is a change of contract: the lake written before it no longer matches, and the dbt model
(transforms/dbt/models/marts/training_samples.sql) must change with it (tests/test_sequences.py compares
a built partition's schema with TRAINING_SAMPLES).
"""

HOUR_MS = 3_600_000
DAY_MS = 86_400_000   # a day partition is [midnight UTC, + DAY_MS) in epoch milliseconds

# The landing logs' vocabularies: a behaviour line's `action`, a click line's `click_type`. The models number
# them 1.. in this order (models/data/samples.py), so appending is compatible and reordering is not.
ACTIONS = ("view", "cart", "fav", "buy")
CLICK_TYPES = ("view_details", "add_to_cart", "follow")

# The event table (lake/events/date=D/*.parquet), one row per impression or behaviour: the Spark events job
# writes it (transforms.spark.events), the blocking events_schema check holds each partition to it
# (quality.events) and the sequence build refuses a partition without what stg_events.sql reads
# (transforms.sequences). Types are kept DuckDB-simple so the files read the same in Spark, DuckDB and pandas.
EVENT_COLUMNS: dict[str, str] = {
    "event_kind": "string",       # 'impression' | 'behavior'
    "user_id": "string",
    "ts_ms": "int64",
    "request_id": "string",
    "impression_id": "string",
    "item_id": "string",          # ad_id for impressions, item_id for behaviors
    "ad_id": "string",
    "campaign_id": "string",
    "advertiser_id": "string",
    "category_id": "string",
    "brand_id": "string",
    "position": "int32",
    "surface": "string",
    "device": "string",
    "action": "string",           # behaviors only
    "label": "int32",             # impressions: 1 if a click was attributed, else 0; behaviors: null
    "click_type": "string",
    "dwell_ms": "int64",
    "click_ts_ms": "int64",
}
SPARK_TYPES = {"string": "string", "int64": "bigint", "int32": "int"}   # each Arrow type's Spark SQL name
NOT_STAGED = ("ad_id", "click_ts_ms")   # event columns the sequence build does not read; the rest must be there


def spark_columns() -> dict[str, str]:
    """The event columns with their Spark SQL types."""
    return {c: SPARK_TYPES[t] for c, t in EVENT_COLUMNS.items()}


# Item statistics (issue #34, the industry's pre-sequence features): per ad and per campaign, impressions and
# clicks of every user over trailing windows of days. A sample of day D counts the windows that end on D-2:
# the daily run of D-1 finishes only after D's files land, so D-2 is the newest day serving holds all of D,
# and every counted impression is a day or more older than the scored one (more than MaskConfig.delay_ms).
# The dbt model item_windows builds them per serving day (transforms/dbt/models/marts/item_windows.sql), the
# targets of training_samples carry them, and the online store serves the same rows keyed by ad and campaign.
ITEM_STAT_LEVELS = ("ad", "campaign")         # the request's ad_id and campaign_id
ITEM_STAT_WINDOWS_DAYS = (7, 28)              # ours: a week and four weeks (weekday cycles average out)
ITEM_STAT_LAG_DAYS = 2                        # a sample of day D counts days <= D - ITEM_STAT_LAG_DAYS
ITEM_STAT_COLUMNS = tuple(f"{level}_{count}_{days}d" for level in ITEM_STAT_LEVELS
                          for days in ITEM_STAT_WINDOWS_DAYS for count in ("impressions", "clicks"))

# One training_samples file (lake/training_samples/date=D/*.parquet): one row per event, rows contiguous per
# user in (user_id, event_rank) order; the user's history as of the end of D-1, then D's events, whose
# impressions are the targets. Column -> Arrow type name (pyarrow.type_for_alias).
TRAINING_SAMPLES: dict[str, str] = {
    "user_id": "string", "ts_ms": "int64", "event_rank": "int64", "is_target": "bool", "event_kind": "string",
    "item_id": "string", "campaign_id": "string", "advertiser_id": "string", "category_id": "string",
    "brand_id": "string", "surface": "string", "device": "string", "action": "string", "position": "int32",
    "position_bucket": "int32", "label": "int8", "click_type": "string", "dwell_ms": "int64",
    "request_id": "string", "impression_id": "string", "event_date": "date32",
    # on targets only (null on history rows): the ad's and campaign's counts as of D (ITEM_STAT_COLUMNS)
    **{column: "int64" for column in ITEM_STAT_COLUMNS},
}

# models.kernels.interval_attention's backends: "auto" picks Triton on CUDA and the torch reference elsewhere;
# "naive" (dense mask) is for tests, "sdpa" (dense-mask torch SDPA) for benchmarks, "prefix" (keys limited to
# the first n_keys tokens, traceable) is what the ONNX export of the serving layout runs.
ATTENTION_BACKENDS = ("auto", "reference", "triton", "naive", "sdpa", "prefix")
