"""The production rehearsal (deploy/stack.py): the tiny world's days landed at once and run by the landing
sensor through the stack's dagster-daemon (Postgres instance), Spark standalone, the MLflow server and
torchrun with 2 processes; the results equal `genrank run`'s (the session's tiny_pipeline); `genrank serve`
scores with the champion read from the server. The stack comes up once for the module, on free ports and a
home of its own, and is taken down by its PID files even when a test fails (and with this process)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from deploy import registry as reg
from deploy import stack as stack_module
from deploy.stack import Ports, Stack, free_port
from pipelines import operating
from tests.operating.services import BIN, Service
from tests.operating.test_daemon import _assert_serial_and_in_date_order, _daily_runs
from transforms import landing

pytestmark = [pytest.mark.stack, pytest.mark.slow]

# DDP sums gradients in another order than one process: the out-of-time AUC of a version trained by torchrun
# with 2 processes may differ from single-process training's in the last digits; decisions may not.
AUC_TOLERANCE = 2e-3
RUN_ENV = {
    "GENRANK_LATENCY_BUDGET_MS": "1e9",   # as tiny_pipeline: wall-clock time must not decide a test
    "GENRANK_SENSOR_INTERVAL_S": "5",
    "GENRANK_START_DATE": "2026-01-01",
    "GENRANK_TRAIN_PROCS": "2",
}


@pytest.fixture(scope="module")
def stack():
    """The stack on a fresh home that PostgreSQL's user can traverse (pytest's tmp folders are private to root)."""
    home = Path(tempfile.mkdtemp(prefix="genrank-stack-"))
    home.chmod(0o755)
    stack = Stack(home, Ports.free(), env=RUN_ENV)
    try:
        started = time.monotonic()
        stack.up(die_with_parent=True)
        print(f"stack start-up: {time.monotonic() - started:.1f} s")
        with pytest.MonkeyPatch.context() as patch:   # what deploy/dagster.yaml reads, for this process's instance
            for name, value in stack.pipeline_env().items():
                if name.startswith("DAGSTER_PG_"):
                    patch.setenv(name, value)
            yield stack
    finally:
        stack.down()
        assert not any(stack.folder.glob("*.pid"))
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.timeout(3600)   # four days on 2 shared cores: each day's Spark, dbt, teacher and torchrun steps
def test_the_daily_job_runs_through_the_stack_as_genrank_run_does(tiny_pipeline, stack):
    reference_home, report, reference_stdout = tiny_pipeline
    home = stack.home
    assert stack.up() == {}                       # up twice: everything is already up, nothing starts
    started = time.monotonic()
    landing.land_days(reference_home, home, report.days)
    instance = dg.DagsterInstance.from_config(str(stack.dagster_home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    deadline = time.monotonic() + 3000
    while True:
        plan = operating.plan_next_day(instance, home, dt.datetime.now(dt.timezone.utc), 6.0)
        assert " is blocked" not in plan.reason, f"{plan.reason}\n{_logs(stack)}"
        if plan.request is None and plan.reason == f"all {len(report.days)} landed day(s) are done":
            break
        assert time.monotonic() < deadline, f"the stack did not finish the days: {plan.reason}\n{_logs(stack)}"
        time.sleep(5)
    print(f"{len(report.days)} daemon-driven days on the stack: {time.monotonic() - started:.0f} s")
    records = _daily_runs(instance)
    assert _assert_serial_and_in_date_order(records) == report.days
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)

    # the events job ran on the standalone cluster, the student through torchrun
    assert any(home.glob("stack/spark-work/app-*/0/stderr"))
    for day in report.days:
        for dataset in ("user_sequences", "training_samples"):
            pd.testing.assert_frame_equal(pd.read_parquet(home / "lake" / dataset / f"date={day}"),
                                          pd.read_parquet(reference_home / "lake" / dataset / f"date={day}"),
                                          obj=f"{dataset} {day}")

    # the registry in the server: the same versions, inputs and decisions; artifacts only through the server
    ours = reg.default_registry(home, stack.pipeline_env()["MLFLOW_TRACKING_URI"])
    theirs = reg.default_registry(reference_home)
    for name in (reg.TEACHER, reg.CTR):
        mine, ref = _versions(ours, name), _versions(theirs, name)
        assert sorted(mine) == sorted(ref), name
        for version, tags in ref.items():
            for tag in ("partition", "data_window", "data_fingerprint", "code_version", "teacher_version",
                        "warm_start_from", "gate_decision"):
                assert mine[version].get(tag) == tags.get(tag), (name, version, tag)
            if "oot_auc" in tags:
                assert abs(float(mine[version]["oot_auc"]) - float(tags["oot_auc"])) <= AUC_TOLERANCE, (version, tags)
        assert all(v.source.startswith("mlflow-artifacts:") or v.source.startswith("models:/")
                   for v in ours.client.search_model_versions(f"name='{name}'"))
    champion = ours.by_alias(reg.CTR, "champion")
    assert champion is not None and str(champion.version) == str(theirs.by_alias(reg.CTR, "champion").version)
    assert not (home / "mlartifacts").exists()
    assert any((home / "stack" / "mlartifacts").rglob("model.onnx"))

    # genrank serve scores with the champion it reads from the server
    user = pd.read_parquet(home / "lake" / "training_samples" / f"date={report.days[-1]}", columns=["user_id"])["user_id"].iloc[0]
    port = free_port()
    server = Service("genrank-serve", [str(BIN / "genrank"), "serve", "--home", str(home), "--port", str(port)],
                     {**os.environ, **stack.pipeline_env(), "GENRANK_SERVE_THREADS": "1"}, home / "stack")
    try:
        body = _score(port, {"user_id": user, "candidates": [{"ad_id": "ad-1", "surface": "feed"}]}, server)
    finally:
        server.stop()
    assert body["model_version"] == str(champion.version) and body["history_source"] == "store"
    assert 0 < body["scores"][0]["p"][0] < 1


def _versions(registry: reg.Registry, name: str) -> dict[str, dict[str, str]]:
    """Version (as a string: a tracking server gives strings, the SQLite store ints) -> tags."""
    return {str(v.version): dict(v.tags) for v in registry.client.search_model_versions(f"name='{name}'")}


def _score(port: int, payload: dict, server: Service, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                if response.status == 200:
                    break
        assert time.monotonic() < deadline, f"genrank serve never became healthy: {server.tail()}"
        time.sleep(2)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/score", data=json.dumps(payload).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _logs(stack: Stack) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                     for log in sorted((stack.folder / "logs").glob("*.log")))


def test_a_port_in_use_is_named_and_nothing_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        stack = Stack(tmp_path, dataclasses.replace(Ports.free(), postgres=port))
        with pytest.raises(ValueError, match=f"port {port} is in use: postgres"):
            stack.up()
    assert not any(stack.folder.glob("*.pid"))


def test_down_stops_only_what_its_pid_files_name(tmp_path):
    """A PID file whose process was replaced (same PID, another start time) is stale: down signals nothing."""
    stack = Stack(tmp_path, Ports.free())
    stack.folder.mkdir(parents=True)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (stack.folder / "spark-worker.pid").write_text(f"{bystander.pid} 1")
        assert stack.status()["spark-worker"] is None
        assert stack.down(log=lambda line: None) == []
        assert bystander.poll() is None and not (stack.folder / "spark-worker.pid").exists()
    finally:
        os.kill(bystander.pid, signal.SIGKILL)
        bystander.wait()


def test_down_stops_what_a_dead_leaders_session_left_and_nothing_else(tmp_path):
    """A dagster-daemon killed without stopping its children leaves them (its code server, their runs) in its
    session: down stops them by that session and the service's marker they inherited; a process of another
    session is left alone, even with the marker."""
    stack = Stack(tmp_path, Ports.free())
    (stack.folder / "logs").mkdir(parents=True)
    daemon = next(s for s in stack.services() if s.name == "dagster-daemon")
    child_pid_file = tmp_path / "child.pid"
    leader = stack_module.Service(daemon.name, [], lambda: ["bash", "-c", f"sleep 300 & echo $! > {child_pid_file}; wait"],
                                  ready=lambda: True)
    marker = {stack_module.SERVICE_MARKER: daemon.marker(stack.folder)}
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**os.environ, **marker})
    proc = leader.launch(stack.folder, dict(os.environ), stack.folder / "logs" / "dagster-daemon.log", die_with_parent=True)
    child = None
    try:
        while not child_pid_file.exists() or not child_pid_file.read_text().strip():
            time.sleep(0.1)
        child = int(child_pid_file.read_text())
        proc.kill()
        proc.wait()
        assert stack.status()["dagster-daemon"] is None and stack_module._start_time(child) is not None
        assert stack.down(log=lambda line: None) == ["dagster-daemon"]
        assert stack_module._start_time(child) is None and bystander.poll() is None
        assert not any(stack.folder.glob("*.pid"))
    finally:
        for pid in filter(None, (child, bystander.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        bystander.wait()


def test_the_stack_pins_one_start_date_for_its_processes(tmp_path, monkeypatch):
    """GENRANK_START_DATE as `genrank run` decides it (the caller's, else the first complete landing day),
    recorded while the Dagster services run; a different one then is refused, as is a date that is none."""
    monkeypatch.delenv("GENRANK_START_DATE", raising=False)
    stack = Stack(tmp_path, Ports.free())
    with pytest.raises(ValueError, match="genrank stack up"):
        stack.pipeline_env()
    stack.folder.mkdir(parents=True)
    stack.password_file.write_text("secret")
    assert stack.pipeline_env()["GENRANK_START_DATE"] == "2026-01-01"
    (tmp_path / "landing" / "date=2026-02-03").mkdir(parents=True)
    (tmp_path / "landing" / "date=2026-02-03" / "_SUCCESS").write_text("{}")
    stack._pin_start_date(dagster_running=False)
    monkeypatch.setenv("GENRANK_START_DATE", "2026-02-01")
    assert stack.pipeline_env()["GENRANK_START_DATE"] == "2026-02-03"   # recorded: what the services run with
    with pytest.raises(ValueError, match=r"run with GENRANK_START_DATE=2026-02-03 .* not 2026-02-01: `genrank stack down`"):
        stack._pin_start_date(dagster_running=True)
    stack._pin_start_date(dagster_running=False)                          # restarted: the caller's date
    assert stack.pipeline_env()["GENRANK_START_DATE"] == "2026-02-01"
    monkeypatch.setenv("GENRANK_START_DATE", "2026-02-30")
    with pytest.raises(ValueError, match="'2026-02-30' is not an ISO date"):
        stack._pin_start_date(dagster_running=False)
