"""The daily partitioning shared by every daily asset."""

from __future__ import annotations

import datetime as dt
import os

import dagster as dg

from pipelines import settings
from transforms import landing

DEFAULT_START_DATE = "2026-01-01"


def start_date() -> str:
    """GENRANK_START_DATE if set, else the first complete landing day, else DEFAULT_START_DATE."""
    configured = os.environ.get("GENRANK_START_DATE")
    if configured:
        return configured
    days = landing.complete_days(settings.genrank_home())
    return days[0] if days else DEFAULT_START_DATE


daily_partitions = dg.DailyPartitionsDefinition(start_date=start_date(), timezone="UTC")


def run_partition_days(run_tags: dict[str, str]) -> list[str]:
    """The days a run materialises: its one partition, or every day of a single-run range backfill.
    Asset checks use it, since they run in their asset's run but have no partition of their own."""
    if "dagster/partition" in run_tags:
        return [run_tags["dagster/partition"]]
    start = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_start"])
    end = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_end"])
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
