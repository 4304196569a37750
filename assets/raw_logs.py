"""``raw_logs``: the landing zone as the ad server writes it (external: Dagster observes, never builds it)."""

import dagster as dg

from assets.partitions import daily_partitions

raw_logs = dg.AssetSpec(
    "raw_logs",
    partitions_def=daily_partitions(),
    group_name="ingest",
    description=(
        "Ad-server logs for one UTC day: landing/date=D/{impressions,clicks,behaviors}-*.jsonl.gz and a "
        "_SUCCESS marker written last. Reported by the landing sensor when a day is complete."
    ),
    metadata={"format": "gzipped JSON lines", "contract": "transforms/landing.py"},
)
