"""The data root's layout: where the landing zone and each lake dataset keep a day.

Every writer and reader of a day partition builds its path here, so that the Spark job, the dbt build, the
assets, the online store, the monitor and the tests agree on one layout (Hive-style ``date=YYYY-MM-DD``
folders, which Spark, DuckDB and pyarrow read as a partition column):

    GENRANK_HOME/landing/date=D/                 the raw logs as they land (transforms.landing)
    GENRANK_HOME/lake/<dataset>/date=D/          one day of a dataset (the names below)
"""

from __future__ import annotations

import os
from pathlib import Path

LANDING = "landing"
LAKE = "lake"
PARTITION_PREFIX = "date="

# The lake's datasets that more than one package reads or writes.
EVENTS = "events"                               # the Spark events job's table (contracts.EVENT_COLUMNS)
EVENTS_QUARANTINE = "quarantine"                # rows the events job refused, with their reason
TRAINING_SAMPLES = "training_samples"           # the dbt build's model input (contracts.TRAINING_SAMPLES)
USER_SEQUENCES = "user_sequences"               # each user's events up to D, the online store's source
ITEM_WINDOWS = "item_windows"                   # item statistics for requests on D (the run of D-1 writes them)
QUARANTINE_FILES = "quarantine_files"           # landing files an operator set aside (genrank landing)
PREDICTION_LOG_QUARANTINE = "prediction_log_quarantine"   # logged lines the serving monitor could not use


def day_dir(base: str | os.PathLike, day: str) -> Path:
    """``base/date=D``: one day of whatever ``base`` holds."""
    return Path(base) / f"{PARTITION_PREFIX}{day}"


def days_in(base: str | os.PathLike) -> list[str]:
    """The days that have a ``date=D`` folder under ``base``, oldest first."""
    base = Path(base)
    return sorted(p.name.removeprefix(PARTITION_PREFIX) for p in base.glob(f"{PARTITION_PREFIX}*")) if base.is_dir() else []


def landing(home: str | os.PathLike) -> Path:
    return Path(home) / LANDING


def lake(home: str | os.PathLike) -> Path:
    return Path(home) / LAKE


def dataset(home: str | os.PathLike, name: str) -> Path:
    return lake(home) / name


def partition(home: str | os.PathLike, name: str, day: str) -> Path:
    """``home/lake/<name>/date=D``."""
    return day_dir(dataset(home, name), day)
