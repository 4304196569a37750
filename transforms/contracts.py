"""The event table's data contract: its columns and their Arrow types, in one place.

The Spark events job writes it (``transforms.spark.events``), the blocking ``events_schema`` check
holds each partition to it (``quality.events``), and the sequence build refuses a partition that
does not carry what ``stg_events.sql`` reads (``transforms.sequences``). Types are kept
DuckDB-simple so the Parquet files read the same in Spark, DuckDB and pandas.
"""

from __future__ import annotations

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

# What each Arrow type is called in Spark SQL.
SPARK_TYPES = {"string": "string", "int64": "bigint", "int32": "int"}

# Event columns the sequence build does not read (stg_events.sql): the rest must be present.
NOT_STAGED = ("ad_id", "click_ts_ms")


def spark_columns() -> dict[str, str]:
    """The event columns with their Spark SQL types."""
    return {c: SPARK_TYPES[t] for c, t in EVENT_COLUMNS.items()}
