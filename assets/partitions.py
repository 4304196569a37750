"""The daily partitioning shared by every daily asset, and the rule that decides where it starts.

The set starts on the first daily partition of the data root the process serves: GENRANK_START_DATE when
set, else the first complete landing day, else the settings' default. It is built when it is asked for (the
asset modules ask when the code location loads), never when this module is imported: the command line, the
runner and the operating rules import this module long before they know which data root they serve, and a
set frozen then would leave every dataset dated before the default outside it.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from pathlib import Path

import dagster as dg

from contracts import settings
from transforms import landing


def first_partition_day(home: Path) -> str:
    """GENRANK_START_DATE when set, else the first complete landing day under ``home``, else the default."""
    start = settings.requested_start_date() or next(iter(landing.complete_days(home)), settings.DEFAULT_START_DATE)
    try:
        dt.date.fromisoformat(start)
    except ValueError:
        raise ValueError(f"GENRANK_START_DATE={start!r} is not an ISO date (YYYY-MM-DD)") from None
    return start


@functools.cache
def _daily_partitions_from(start: str) -> dg.DailyPartitionsDefinition:
    return dg.DailyPartitionsDefinition(start_date=start, timezone="UTC")


def daily_partitions() -> dg.DailyPartitionsDefinition:
    """The daily partitions of GENRANK_HOME, as this process's environment decides them now."""
    return _daily_partitions_from(first_partition_day(settings.genrank_home()))


def pin_start_date(home: Path) -> str:
    """Set GENRANK_START_DATE to ``first_partition_day(home)`` in this process's environment, so that every
    process it starts (dagster's code server, daemon and run workers, the run it executes) loads the same
    partition set, whatever lands later. Every `genrank` command that loads the code location calls this."""
    day = os.environ["GENRANK_START_DATE"] = first_partition_day(home)
    return day


def check_days_in_partitions(days: list[str], partitions: dg.DailyPartitionsDefinition | None = None) -> None:
    """Raise a one-line ValueError, saying what to do, when landed ``days`` fall outside the partition set
    (GENRANK_START_DATE set later than the data, a shell pinned to another data root, a day in the future)."""
    partitions = partitions or daily_partitions()
    first, last = partitions.get_first_partition_key(), partitions.get_last_partition_key()
    before = [d for d in days if d < first]
    after = [d for d in days if last is None or d > last]
    if before:
        raise ValueError(
            f"{len(before)} landed day(s) ({before[0]}..{before[-1]}) are before the first daily partition {first} "
            f"(GENRANK_START_DATE={first}): unset GENRANK_START_DATE, so that the command pins it to the first "
            f"landing day, or set it to {before[0]} (in a `genrank stack env` shell: `genrank stack down` and up "
            "again)")
    if after:
        raise ValueError(f"{len(after)} landed day(s) ({after[0]}..{after[-1]}) are after the last complete day "
                         f"{last}: a daily partition exists once its day has ended")


def run_partition_days(run_tags: dict[str, str]) -> list[str]:
    """The days a run materialises: its one partition, or every day of a single-run range backfill.
    Asset checks use it, since they run in their asset's run but have no partition of their own."""
    if "dagster/partition" in run_tags:
        return [run_tags["dagster/partition"]]
    start = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_start"])
    end = dt.date.fromisoformat(run_tags["dagster/asset_partition_range_end"])
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
