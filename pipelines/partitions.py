"""The daily partitioning shared by every daily asset."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from pipelines import settings

daily_partitions = dg.DailyPartitionsDefinition(start_date=settings.start_date(), timezone="UTC")


def run_partition_days(run_tags: dict[str, str]) -> list[str]:
    """The days a run materialises: its one partition, or every day of a single-run range backfill.
    Asset checks use it, since they run in their asset's run but have no partition of their own."""
    if "dagster/partition" in run_tags:
        return [run_tags["dagster/partition"]]
    start = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_start"])
    end = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_end"])
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
