"""The run report's serving-monitor plot: what it draws per day, and that the report links it."""

from __future__ import annotations

import math

from pipelines.report import monitoring_series, write_run_report
from pipelines.runner import DayResult

PSI = {"surface": {"psi": 0.02}, "category": {"psi": 0.31}, "history_len": {"psi": None, "skipped": "not served"}}


def _days() -> list[DayResult]:
    served = {"served": True, "skew_max_abs_diff": 2e-6, "psi": PSI,
              "calibration_by_bucket": [{"bucket": 0, "calibration": 1.07}, {"bucket": 1, "calibration": 0.91}]}
    not_served = {"served": False, "skew_max_abs_diff": 0.0, "psi": {"surface": {"psi": 0.05}},
                  "calibration_by_bucket": []}
    return [DayResult("2026-01-04", True, monitor=not_served), DayResult("2026-01-05", True, monitor=served),
            DayResult("2026-01-06", True)]


def test_each_check_is_a_series_per_day_with_gaps_where_nothing_was_served():
    series = monitoring_series(_days())
    assert sorted(series) == ["bucket 0", "bucket 1", "psi", "skew"]
    assert math.isnan(series["skew"][0]) and series["skew"][1] == 2e-6 and math.isnan(series["skew"][2])
    assert series["psi"][:2] == [0.05, 0.31] and math.isnan(series["psi"][2])   # the largest finite PSI of the day
    assert math.isnan(series["bucket 0"][0]) and series["bucket 0"][1] == 1.07 and series["bucket 1"][1] == 0.91


def test_the_report_links_the_monitoring_plot(tmp_path):
    report = write_run_report(tmp_path / "reports", "20260106T000000Z", _days(), "No champion: test.",
                              f"sqlite:///{tmp_path / 'mlflow.db'}")
    plot = tmp_path / "reports" / "run-20260106T000000Z-monitoring.png"
    assert plot.stat().st_size > 0
    assert f"![Serving monitor per day: skew, drift, live calibration]({plot.name})" in report.read_text()
