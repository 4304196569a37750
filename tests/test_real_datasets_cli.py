"""A real dataset dated before 2026 through the command line, as a new user runs it: `genrank import`, then
`genrank run --home`, each a fresh interpreter. The partition set follows the landing zone whatever was imported
first, a landing zone outside an explicitly pinned set is a one-line error that writes nothing, and
`genrank status` keeps the libraries' logs off the console."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} is absent")]

GENRANK = str(Path(sys.executable).with_name("genrank"))
SINCE, UNTIL = "2015-11-02", "2015-11-06"       # the slice issue #38 was reported on: 5 days, ~2k ratings
DAYS = [f"2015-11-0{d}" for d in range(2, 7)]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI", "GENRANK_START_DATE", "GENRANK_HOME")}
    # wall-clock time must not decide a test: the latency gate is unit-tested in tests/test_gates.py
    return {**env, "GENRANK_LATENCY_BUDGET_MS": "1e9", **extra}


def _genrank(*args: str, env: dict[str, str], timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([GENRANK, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def movielens_landing(tmp_path_factory) -> Path:
    """MovieLens latest-small, 2015-11-02..06, imported by the console script into a fresh data root."""
    home = tmp_path_factory.mktemp("movielens")
    out = _genrank("import", "movielens", "--src", str(SHARED_DATA / "movielens_latest_small"), "--out", str(home),
                   "--since", SINCE, "--until", UNTIL, "--fill-gaps", env=_env(home))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "reconciled: yes" in out.stdout
    return home


def _landing_copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source / "landing", dest / "landing")
    return dest


# The imports in the order that froze the partition set at 2026-01-01 before the data root was known (issue #38)
BROKEN_ORDER = "import sys, assets.partitions, pipelines.operating, pipelines.runner, pipelines.cli; "


def test_status_on_a_new_home_keeps_the_library_logs_off_the_console(movielens_landing, tmp_path):
    """`genrank status` from an interpreter that imported the modules in the order of issue #38 first: every
    landed day is in the partition set, and the libraries' INFO lines go to the status log."""
    home = _landing_copy(movielens_landing, tmp_path / "home")
    status = BROKEN_ORDER + f"sys.exit(pipelines.cli.main(['status', '--home', {str(home)!r}]))"
    out = subprocess.run([sys.executable, "-c", status], env=_env(home), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr == ""
    assert "INFO" not in out.stdout and "Creating initial MLflow database tables" not in out.stdout
    assert all(re.search(rf"^  {day}  landed, not run yet", out.stdout, re.M) for day in DAYS), out.stdout
    assert "Creating initial MLflow database tables" in (home / "logs" / "status.log").read_text()


def test_a_start_date_pinned_after_the_landed_days_is_a_one_line_error_that_writes_nothing(movielens_landing,
                                                                                            tmp_path):
    home = _landing_copy(movielens_landing, tmp_path / "home")
    out = _genrank("run", "--home", str(home), env=_env(home, GENRANK_START_DATE="2026-01-01"))
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert re.match(rf"genrank run: error: 5 landed day\(s\) \({DAYS[0]}\.\.{DAYS[-1]}\) are before the first daily "
                    r"partition 2026-01-01 .*unset GENRANK_START_DATE", out.stderr), out.stderr
    assert sorted(p.name for p in home.iterdir()) == ["landing"]


def test_movielens_2015_through_import_and_run(movielens_landing, tmp_path):
    """Every day processed by the console script, the run ending in a champion or one line saying why none;
    with -v the libraries' logs are on the console, and a report folder that cannot be written is a warning
    naming why while the command still succeeds."""
    home = _landing_copy(movielens_landing, tmp_path / "home")
    (home / "reports").write_text("a file where the folder should be")
    out = _genrank("run", "--home", str(home), "-v", env=_env(home))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for day in DAYS:
        assert re.search(rf"^{day}  (ok    |refused)  ", out.stdout, re.M), out.stdout[-5000:]
    assert re.search(r"^5/5 days ran", out.stdout, re.M), out.stdout[-5000:]
    assert re.search(r"^(Champion: genrank-ctr v\d+ |No champion: .+\.$)", out.stdout, re.M), out.stdout[-5000:]
    console = out.stdout + out.stderr
    assert "Traceback" not in console
    assert "Running with dbt" in console and "dagster - INFO" in console
    assert re.search(r"^warning: no run report \((FileExistsError|NotADirectoryError): ", out.stdout, re.M), out.stdout[-5000:]


def test_the_code_location_loaded_on_its_own_starts_at_the_first_landing_day(movielens_landing):
    """What `dagster dev -w workspace.yaml`, the daemon's code server and a run worker do: load the definitions
    with only GENRANK_HOME set (after the imports of issue #38's order)."""
    load = (BROKEN_ORDER + "from pipelines.definitions import defs; "
            "print(defs.resolve_job_def('daily_job').partitions_def.get_first_partition_key())")
    out = subprocess.run([sys.executable, "-c", load], env=_env(movielens_landing, GENRANK_HOME=str(movielens_landing)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [SINCE]
