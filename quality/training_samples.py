"""Great Expectations checks on one day's exported training samples (all blocking).

* ``samples_targets_labelled``: every target impression has a label in {0, 1}, a position bucket
  and a request id;
* ``samples_bucket_range``: position buckets lie in 0..K-1;
* ``samples_no_future_leakage``: every history row (an earlier day's event) is older than the
  start of D, and no row is newer than the end of D.
"""

from __future__ import annotations

from pathlib import Path

from contracts import DAY_MS
from quality.framework import CheckDef, DatasetChecks, CheckOutcome, validate_frame
from transforms import landing

TRAINING_SAMPLES_CHECKS = DatasetChecks("training_samples", (
    CheckDef("samples_targets_labelled", "Every target impression has a 0/1 label, a position bucket and a request id."),
    CheckDef("samples_bucket_range", "Position buckets are within 0..K-1."),
    CheckDef("samples_no_future_leakage", "History rows are older than the day; nothing is newer than its end."),
))


def validate_training_samples(path: str | Path, day: str, n_buckets: int) -> dict[str, CheckOutcome]:
    import great_expectations as gx
    import pandas as pd
    from great_expectations.expectations.row_conditions import Column

    E = gx.expectations
    df = pd.read_parquet(path, columns=["is_target", "label", "position_bucket", "request_id", "ts_ms", "event_date"])
    start = landing.day_start_ms(day)
    df["is_history"] = pd.to_datetime(df["event_date"]) < pd.Timestamp(day)
    target = {"row_condition": Column("is_target") == True}  # noqa: E712 (a GX row condition, not a test)
    history = {"row_condition": Column("is_history") == True}  # noqa: E712
    expectations = {
        "samples_targets_labelled": [
            E.ExpectColumnValuesToNotBeNull(column="label", **target),
            E.ExpectColumnValuesToBeInSet(column="label", value_set=[0, 1], **target),
            E.ExpectColumnValuesToNotBeNull(column="position_bucket", **target),
            E.ExpectColumnValuesToNotBeNull(column="request_id", **target),
        ],
        "samples_bucket_range": [
            E.ExpectColumnValuesToBeBetween(column="position_bucket", min_value=0, max_value=n_buckets - 1),
        ],
        "samples_no_future_leakage": [
            E.ExpectColumnValuesToBeBetween(column="ts_ms", max_value=start - 1, **history),
            E.ExpectColumnValuesToBeBetween(column="ts_ms", max_value=start + DAY_MS - 1),
        ],
    }
    return validate_frame(df.drop(columns=["event_date"]), expectations, f"training_samples_{day}")
