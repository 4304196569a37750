"""What `genrank run` shows: its own lines only (a live line per day on a terminal, the day's summary
row, the champion, the report), the libraries' logs in $GENRANK_HOME/logs/, on the console with -v."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from tests.conftest import copy_home

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


def test_verbose_shows_the_library_logs_and_an_unwritable_report_is_only_a_warning(tiny_pipeline, tmp_path):
    source, report, _ = tiny_pipeline
    home = copy_home(source, tmp_path / "home")
    shutil.rmtree(home / "reports")
    (home / "reports").write_text("a file where the folder should be")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI")}
    day = report.days[0]
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--home", str(home), "--start", day, "--end", day, "-v"],
                         env={**env, "GENRANK_HOME": str(home), "GENRANK_LATENCY_BUDGET_MS": "1e9"},
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    console = out.stdout + out.stderr
    assert "Running with dbt" in console and "dagster - INFO" in console
    assert re.search(rf"^{day}  ok ", out.stdout, re.M)
    # the day ran; the report it could not write is a warning naming why, and the command still succeeds
    assert re.search(r"^warning: no run report \((FileExistsError|NotADirectoryError): ", out.stdout, re.M), out.stdout


def test_write_run_report_raises_where_its_folder_cannot_be_made(tmp_path):
    from pipelines.report import write_run_report

    blocked = tmp_path / "reports"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(OSError):
        write_run_report(blocked, "20260101T000000Z", [], "No champion yet", f"sqlite:///{tmp_path / 'mlflow.db'}")
