"""The run report: the serving-monitor plot (what it draws per day, and that the report links it) and where the
time and memory go (the stage tables, the process tree's peak)."""

from __future__ import annotations

import math
import os

import pytest

from pipelines.report import monitoring_series, stage_tables, stages_line, write_run_report
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


def test_the_stage_tables_add_each_stage_over_the_days_and_keep_its_largest_peak():
    days = _days()[:2]
    days[0].stages = {"events": (10.0, 300 << 20), "sequence_models": (2.5, None)}
    days[1].stages = {"events": (4.0, 500 << 20), "student_candidate": (20.0, 900 << 20)}
    lines = stage_tables(days)
    assert "| student_candidate | - | 20.0 | 20.0 |" in lines      # the slowest stage over the run first
    assert lines.index("| student_candidate | - | 20.0 | 20.0 |") < lines.index("| events | 10.0 | 4.0 | 14.0 |")
    assert "| **day** | 12.5 | 24.0 | 36.5 |" in lines
    assert "| events | 300 | 500 | 500 |" in lines and "| sequence_models | - | - | - |" in lines
    assert stages_line(days).startswith("Time by stage: student_candidate 20 s, events 14 s, sequence_models 2 s "
                                        "(of 36 s in steps); peak RSS 0.9 GiB (student_candidate)")


def test_the_peak_is_the_whole_process_trees(tmp_path):
    """A child that holds 200 MiB counts in its parent's tree, sampled under the step that was current."""
    import subprocess
    import sys
    import time

    from pipelines.stage_profile import PeakByStep, tree_rss_bytes

    before = tree_rss_bytes(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200 << 20); time.sleep(30)"])
    try:
        with PeakByStep(lambda: "holding", interval_s=0.1) as peaks:
            deadline = time.monotonic() + 20
            while tree_rss_bytes(os.getpid()) - before < 190 << 20:
                assert time.monotonic() < deadline, "the child's memory never showed in the tree"
                time.sleep(0.1)
            time.sleep(0.3)
        assert peaks.peaks["holding"] - before >= 190 << 20
        assert tree_rss_bytes(child.pid) >= 190 << 20
    finally:
        child.kill()
        child.wait()
    assert tree_rss_bytes(child.pid) is None   # gone: no /proc entry


def test_freed_heap_goes_back_to_the_os_after_a_step():
    """What a step freed in the middle of the C heap (under a live block, so glibc never trims it by itself)
    leaves the process's resident memory once the daily job's success hook has run; without it, it stays."""
    import subprocess
    import sys

    from pipelines.jobs import daily_job, return_freed_heap_after_step

    assert return_freed_heap_after_step in daily_job.hooks
    probe = """
import sys
from pipelines.stage_profile import return_freed_heap
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
blocks = [bytes([i % 251]) * 60_000 for i in range(3_000)]   # 180 MB of 60 kB blocks: the heap, not mmap
pin = bytes([7]) * 60_000
del blocks
held = rss()
if sys.argv[1] == "hook" and not return_freed_heap():
    print("no glibc"); raise SystemExit
print(held, rss())
"""
    runs = {}
    for mode in ("hook", "none"):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, check=True).stdout
        if out.startswith("no glibc"):
            pytest.skip("malloc_trim is glibc's")
        runs[mode] = [int(x) for x in out.split()]
    assert runs["none"][0] - runs["none"][1] < 20           # free() alone keeps the pages
    assert runs["hook"][0] - runs["hook"][1] >= 150          # the hook returns them
