"""Shared fixtures: one simulated tiny world and one tiny pipeline run per test session, a copy of a home
for the tests that change one, and the CI rule that only the CUDA tests may skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "true")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_configure(config):
    """dbt's manifest, current before any test loads the code location (which never parses it)."""
    from transforms.sequences import ensure_manifest

    config.addinivalue_line("markers", "cuda: needs a CUDA GPU; the only tests that may skip in CI")
    config.addinivalue_line("markers", "breaks(*checks): the test makes these 'asset:check's fail (tests/test_check_map.py)")
    ensure_manifest()


def _fail_a_skip_in_ci(report, node) -> None:
    """In CI (CI=true) a skip hides work a clean clone must do (the real-data tests: CI has ../shared/data),
    so any skip but a CUDA test's fails the run, with the skip's reason."""
    from contracts import settings

    if report.skipped and not hasattr(report, "wasxfail") and settings.ci() and node.get_closest_marker("cuda") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where only the CUDA tests may skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    _fail_a_skip_in_ci((yield).get_result(), item)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped while it is collected (pytest.importorskip at its top)."""
    _fail_a_skip_in_ci((yield).get_result(), collector)


def copy_home(source: Path, dest: Path) -> Path:
    """A copy of a genrank home that shares nothing with it: the MLflow store records its artifact locations
    as absolute paths, so they are moved to the copy's, and a version the copy registers, or an artifact it
    changes, stays in the copy."""
    import contextlib
    import sqlite3

    shutil.copytree(source, dest)
    old, new = f"file://{Path(source).resolve()}/", f"file://{Path(dest).resolve()}/"
    with contextlib.closing(sqlite3.connect(dest / "mlflow.db")) as con, con:
        tables = [t for (t,) in con.execute("select name from sqlite_master where type = 'table'")]
        for table in tables:
            for column in [c[1] for c in con.execute(f"pragma table_info('{table}')")]:
                con.execute(f'update "{table}" set "{column}" = replace("{column}", ?, ?) where "{column}" like ?',
                            (old, new, old + "%"))
    return dest


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The `tiny` preset, seed 0, simulated once: (root, SimulationReport)."""
    from transforms.simulator import simulate

    root = tmp_path_factory.mktemp("tiny_world")
    report = simulate(preset="tiny", seed=0, out=root)
    print("\n" + report.summary())
    return root, report


def _home_state(home: Path) -> tuple[list, list]:
    """What a test may not change in a shared home: the registry's versions (tags, aliases) and the lake's files."""
    from deploy import registry as reg

    r = reg.default_registry(home)
    versions = [r.client.get_model_version(name, v.version) for name in (reg.TEACHER, reg.CTR)
                for v in r.client.search_model_versions(f"name = '{name}'")]
    return (sorted((v.name, str(v.version), sorted(v.tags.items()), sorted(v.aliases)) for v in versions),
            sorted((str(p.relative_to(home)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in (home / "lake").rglob("*") if p.is_file()))


def _run_tiny_pipeline(tmp_path_factory, tiny_world):
    world, report = tiny_world
    home = tmp_path_factory.mktemp("e2e")
    shutil.copytree(world, home, dirs_exist_ok=True)   # the world is simulated once per session
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI")}
    env["GENRANK_HOME"] = str(home)
    # Wall-clock time must not decide a test: the latency gate is unit-tested in tests/test_gates.py.
    env["GENRANK_LATENCY_BUDGET_MS"] = "1e9"
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--home", str(home)], env=env,
                         capture_output=True, text=True, timeout=1800)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return home, report, out.stdout


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory, tiny_world):
    """`genrank run` over every day of a fresh tiny world (a subprocess, as a user runs it):
    (home, SimulationReport, stdout). Read-only, so that no test depends on which ran before it: a test
    that changes the registry or the lake works on a copy_home of it, and the session fails at its end if
    the registry or the lake of this home changed."""
    home, report, stdout = _run_tiny_pipeline(tmp_path_factory, tiny_world)
    before = _home_state(home)
    yield home, report, stdout
    assert _home_state(home) == before, "a test changed the session's tiny_pipeline home: work on copy_home(home, ...)"
