"""What `genrank run` shows: its own lines only (a live line per day on a terminal, the day's summary
row, the champion, the report), the libraries' logs in $GENRANK_HOME/logs/. With -v they are on the console too,
checked on the second run of tests/test_real_datasets_cli.py, which also finds an unwritable report folder a
warning only (a day rerun costs a minute on 2 cores, so the run that test makes anyway serves both)."""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.slow

OWN_LINES = [re.compile(p) for p in (
    r"^$",
    r"^Logs of dbt, Spark, MLflow and Dagster: \S+/logs/run-\d{8}T\d{6}Z\.log$",
    r"^\d{4}-\d{2}-\d{2}  (ok    |refused|FAILED)  ",
    r"^\d{4}-\d{2}-\d{2}  teacher (retrained|reused) before the day: version \d+, trained on ",
    r"^\d+/\d+ days ran",
    r"^Time by stage: ",
    r"^(Champion: genrank-ctr v\d+ |No champion)",
    r"^Report: \S+/reports/run-\d{8}T\d{6}Z\.md$",
    r"^Dagster: DAGSTER_HOME=",
    r"^MLflow:  mlflow ui ",
)]
LIBRARY_MARKERS = ("Running with dbt", "dagster - ", "WARN ", "mlflow", "Downloading artifacts")


def test_genrank_run_prints_its_own_lines_and_logs_the_libraries_to_a_file(tiny_pipeline):
    home, report, stdout = tiny_pipeline
    foreign = [line for line in stdout.splitlines() if not any(p.match(line) for p in OWN_LINES)]
    assert not foreign, foreign[:10]
    assert len(stdout.splitlines()) <= len(report.days) + 12      # one screen plus a line per day
    log = re.search(r"^Logs of dbt, Spark, MLflow and Dagster: (\S+)$", stdout, re.M).group(1)
    logged = open(log).read()
    assert "Running with dbt" in logged and "dagster - " in logged
    written = re.search(r"^Report: (\S+)$", stdout, re.M).group(1)
    table = open(written).read()
    assert all(f"| {day} | ok |" in table for day in report.days) and "out-of-time AUC" in table
    assert os.path.exists(written.replace(".md", "-auc.png"))


def test_write_run_report_raises_where_its_folder_cannot_be_made(tmp_path):
    from pipelines.report import write_run_report

    blocked = tmp_path / "reports"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(OSError):
        write_run_report(blocked, "20260101T000000Z", [], "No champion yet", f"sqlite:///{tmp_path / 'mlflow.db'}")
