"""The daily partitioning shared by every daily asset."""

from __future__ import annotations

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
