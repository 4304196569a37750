"""The production rehearsal (deploy/stack.py) operated as an on-call engineer meets it, on the tiny world: the
stack's dagster-daemon and dagster-webserver (Postgres instance), Spark standalone, the MLflow server and
torchrun with 2 processes. A daily_job backfill launched through the webserver's GraphQL API (what the UI's
"Launch backfill" sends), then the landing sensor driving the other days, one transient failure retried, a garbage
day blocked; the results equal `genrank run`'s (the session's tiny_pipeline); headless Chromium renders the UI's
pages; `genrank serve` scores with the champion read from the server and `genrank replay` sends it a day's
requests, which serving_monitor then checks under the daemon.

One scenario on one stack, because each daemon-driven day costs a minute or more on 2 cores: it shows together
what separate tests would each pay four days for (the sensor does not rerun days a backfill has done; what the
stack runs equals what `genrank run` gives). The stack comes up once for the module, on free ports and a home of
its own, loading the code location with one injected transient fault (flaky_location.py), and is taken down by
its PID files even when a test fails (and with this process)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

from deploy import registry as reg
from deploy import stack as stack_module
from deploy.stack import BIN, Ports, Stack, free_port
from pipelines import operating
from tests.operating.services import Service, browse
from transforms import landing

pytestmark = [pytest.mark.stack, pytest.mark.slow]

# DDP sums gradients in another order than one process: the out-of-time AUC of a version trained by torchrun
# with 2 processes may differ from single-process training's in the last digits; decisions may not.
AUC_TOLERANCE = 2e-3
RUN_ENV = {
    "GENRANK_LATENCY_BUDGET_MS": "1e9",   # as tiny_pipeline: wall-clock time must not decide a test
    "GENRANK_SENSOR_INTERVAL_S": "3",
    "GENRANK_START_DATE": "2026-01-01",
    "GENRANK_TRAIN_PROCS": "2",
}
LOCATION = "genrank"
FLAKY_LOCATION = Path(__file__).with_name("flaky_location.py")


@pytest.fixture(scope="module")
def stack(tiny_pipeline):
    """The stack on a fresh home that PostgreSQL's user can traverse (pytest's tmp folders are private to root),
    its Dagster services loading flaky_location.py: the dbt step of the tiny world's third day fails once."""
    _, report, _ = tiny_pipeline
    home = Path(tempfile.mkdtemp(prefix="genrank-stack-"))
    home.chmod(0o755)
    workspace = home / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_file:\n      relative_path: {FLAKY_LOCATION}\n"
                         f"      working_directory: {stack_module.REPO}\n      location_name: {LOCATION}\n")
    fail_once = {"GENRANK_TEST_FAIL_ONCE": f"{report.days[2]}:{home / 'failed-once'}"}
    stack = Stack(home, Ports.free(), env={**RUN_ENV, **fail_once}, workspace=workspace)
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


def _graphql(stack: Stack, query: str, variables: dict | None = None) -> dict:
    """The webserver's GraphQL API, as the UI calls it."""
    request = urllib.request.Request(f"http://127.0.0.1:{stack.ports.dagster}/graphql",
                                     data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body["errors"]
    return body["data"]


def _wait_until(predicate, stack: Stack, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise TimeoutError(f"{what} after {timeout_s:.0f} s\n{_logs(stack)}")


def _backfill_runs_finished(instance: dg.DagsterInstance, backfill_id: str, n: int) -> bool:
    """The backfill has launched its ``n`` runs and no run of the instance is still queued or in progress."""
    launched = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    return len(launched) == n and not instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES))


def _daily_runs(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    return sorted(instance.get_run_records(dg.RunsFilter(job_name="daily_job")), key=lambda r: r.start_time or 0)


def _assert_serial_and_in_date_order(records: list[dg.RunRecord]) -> list[str]:
    """No two runs in progress at once (start/end times from the instance); days in date order."""
    for earlier, later in zip(records, records[1:]):
        assert earlier.end_time <= later.start_time, (earlier.dagster_run.run_id, later.dagster_run.run_id)
    days = [r.dagster_run.tags["dagster/partition"] for r in records]
    assert days == sorted(days), days
    return days


def _sensor_ticks(instance: dg.DagsterInstance) -> list:
    """The landing sensor's ticks, newest first."""
    [state] = [s for s in instance.all_instigator_state() if s.name == "landing_sensor"]
    return instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1000)


def _finished_ticks_after(instance: dg.DagsterInstance, tick_id: int, n: int) -> list:
    """The finished ticks newer than ``tick_id`` once there are ``n`` of them, else none."""
    ticks = [t for t in _sensor_ticks(instance) if t.tick_id > tick_id and t.status != TickStatus.STARTED]
    return ticks if len(ticks) >= n else []


BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}"""

SENSOR = """
query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
  __typename ... on Sensor { id sensorState { id status } } } }"""

STOP_SENSOR = """
mutation($id: String) { stopSensor(id: $id) { __typename
  ... on StopSensorMutationResult { instigationState { status } } } }"""

CHECK_EXECUTIONS = """
query($key: AssetKeyInput!, $check: String!) { assetCheckExecutions(assetKey: $key, checkName: $check, limit: 20) {
  runId status evaluation { success } } }"""

START_SENSOR = """
mutation($selector: SensorSelector!) { startSensor(sensorSelector: $selector) { __typename
  ... on Sensor { sensorState { status } } ... on PythonError { message } } }"""


@pytest.mark.timeout(3600)   # six daily runs, the retry included, each a Spark, dbt and training run on 2 cores
def test_an_operator_runs_the_days_on_the_stack_as_genrank_run_does(tiny_pipeline, stack, tmp_path):
    """One instance, as an operator meets it, on the production rehearsal:

    1. The operator pauses the landing sensor in the UI; the four tiny days land at once with a fifth whose
       every line is garbage; a daily_job backfill of the first two days is launched through the webserver's
       GraphQL API: one run per day, in date order.
    2. The sensor is started again. It skips the two backfilled days (done, whoever ran them) and starts
       one daily run at a time: day 3's dbt step fails once, transiently, and is retried from that step;
       the first teacher trains inside day 3's run; the garbage day fails a blocking events check, is not
       retried, and stays blocked with its reason while the sensor keeps ticking.
    3. The four days give what `genrank run` gives: the events job ran on the standalone cluster, the student
       through torchrun, the registry is the server's; headless Chromium renders the asset graph, the backfill
       page and the gate checks of challenger_evaluation.
    4. `genrank serve` runs the champion it reads from the server as a process, `genrank replay` sends the last
       day's requests to it over HTTP, and the day's serving_monitor runs under the daemon (an asset backfill,
       as the UI launches one): served, no skew, its checks on the asset's page."""
    reference_home, report, reference_stdout = tiny_pipeline
    home = stack.home
    assert stack.up() == {}                       # up twice: everything is already up, nothing starts
    instance = dg.DagsterInstance.from_config(str(stack.dagster_home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    backfilled, sensed = report.days[:2], report.days[2:]
    garbage_day = (dt.date.fromisoformat(report.days[-1]) + dt.timedelta(days=1)).isoformat()

    repo = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
    sensor_selector = {**repo, "sensorName": "landing_sensor"}
    sensor = _graphql(stack, SENSOR, {"selector": sensor_selector})["sensorOrError"]
    stopped = _graphql(stack, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
    assert stopped["stopSensor"]["instigationState"]["status"] == "STOPPED"
    # the daemon may be inside a sensor iteration that read the state before the stop: let it finish
    _wait_until(lambda: all(t.status != TickStatus.STARTED for t in _sensor_ticks(instance)), stack, 300,
                "the stopped sensor's last tick did not finish")
    # the garbage day lands with the others, so day 4 sees its D+1 (garbage clicks attribute nothing)
    # from its first run, as `genrank run` saw none: day 4 runs once
    garbage = tmp_path / "garbage"
    landing.write_day(garbage, garbage_day, {kind: [f'{{"broken": {i}' for i in range(50)] for kind in landing.FILE_KINDS})
    landing.land_days(reference_home, home, report.days, more=((garbage, garbage_day),))

    started = time.monotonic()
    launched = _graphql(stack, BACKFILL, {"params": {
        "selector": {"partitionSetName": "daily_job_partition_set", "repositorySelector": repo},
        "partitionNames": backfilled, "title": "tiny world, the first days"}})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]
    # the backfill's runs, not its status: the backfill daemon marks a backfill done only at its next iteration,
    # up to 30 s after its last run (checked below, before the backfill's page is read)
    _wait_until(lambda: _backfill_runs_finished(instance, backfill_id, len(backfilled)), stack, 1500,
                "the backfill's runs did not finish")
    print(f"backfill of {len(backfilled)} days: {time.monotonic() - started:.0f} s")
    records = _daily_runs(instance)
    assert _assert_serial_and_in_date_order(records) == backfilled
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records), _logs(stack)
    assert {r.dagster_run.tags.get("dagster/backfill") for r in records} == {backfill_id}

    started = time.monotonic()
    restarted = _graphql(stack, START_SENSOR, {"selector": sensor_selector})["startSensor"]
    assert restarted["sensorState"]["status"] == "RUNNING", restarted

    def settled():
        plan = operating.plan_next_day(instance, home, dt.datetime.now(dt.timezone.utc), 6.0)
        assert " is blocked" not in plan.reason or plan.reason.startswith(garbage_day), f"{plan.reason}\n{_logs(stack)}"
        return plan.request is None and plan.reason.startswith(f"{garbage_day} is blocked")

    _wait_until(settled, stack, 2000, "the daemon did not finish the landed days")
    print(f"sensor-driven days: {time.monotonic() - started:.0f} s")
    records = _daily_runs(instance)
    assert _assert_serial_and_in_date_order(records) == [*backfilled, sensed[0], *sensed, garbage_day]
    assert not any(r.dagster_run.tags.get("dagster/backfill") for r in records[2:])
    assert (home / "failed-once").exists()
    failed, retry = records[2].dagster_run, records[3].dagster_run
    assert failed.status == dg.DagsterRunStatus.FAILURE and failed.tags["dagster/will_retry"] == "true"
    assert retry.parent_run_id == failed.run_id and retry.status == dg.DagsterRunStatus.SUCCESS
    steps = {r.event_log_entry.step_key for r in instance.get_records_for_run(
        retry.run_id, of_type=dg.DagsterEventType.STEP_START).records}
    assert "sequence_models" in steps and "events" not in steps   # retried from the failed step
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records[3:-1])
    # the first teacher trained inside day 3's run, as `genrank run` trains it
    teacher = [e for e in instance.fetch_materializations(dg.AssetKey("teacher_model"), limit=10).records
               if e.asset_materialization.metadata["retrained"].value]
    assert [instance.get_run_by_id(t.run_id).tags["dagster/partition"] for t in teacher] == [sensed[0]]
    _assert_same_results(stack, reference_home, reference_stdout, report.days)
    # the garbage day: stopped by a blocking events check, tagged with it, not retried by the daemon
    blocked = records[-1].dagster_run
    assert blocked.status == dg.DagsterRunStatus.FAILURE
    assert blocked.tags[operating.BLOCKED_BY_TAG].startswith("events:") and blocked.tags[operating.BLOCKED_REASON_TAG]
    assert blocked.tags["dagster/will_retry"] == "false"
    # three more sensor ticks: nothing is requested again, and each tick says why
    newest = _sensor_ticks(instance)[0].tick_id
    more = _wait_until(lambda: _finished_ticks_after(instance, newest, 3), stack, 300,
                       "the sensor did not tick three times")
    assert all((t.skip_reason or "").startswith(f"{garbage_day} is blocked") for t in more), [t.skip_reason for t in more]
    assert len(_daily_runs(instance)) == len(records)
    assert not instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES))
    skip = _sensor_ticks(instance)[0].skip_reason or ""
    assert skip.startswith(f"{garbage_day} is blocked") and blocked.tags[operating.BLOCKED_BY_TAG] in skip, skip

    url = f"http://127.0.0.1:{stack.ports.dagster}"
    graph = browse(f"{url}/asset-groups", tmp_path / "asset-graph.png")
    for group in ("ingest", "sequences", "models"):
        assert group in graph, group
    assert instance.get_backfill(backfill_id).status.value in ("COMPLETED", "COMPLETED_SUCCESS")
    page = browse(f"{url}/runs/b/{backfill_id}", tmp_path / "backfill.png")
    text = " ".join(page.split())
    assert backfill_id in text and "daily_job" in text and f"{len(backfilled)} partitions" in text
    assert "Succeeded" in text and "Join the Dagster community" not in text
    # The reviewer's view of the gates: the asset page of challenger_evaluation lists its checks. Their newest
    # execution is the garbage day's run, stopped before them, and the page says so ("Execution failed");
    # each gate's history (the page's "Execution history" tab, read through the same GraphQL API) holds the
    # passed evaluation of the last good day's run.
    checks = browse(f"{url}/assets/challenger_evaluation?view=checks", tmp_path / "gates.png")
    last_good = records[-2].dagster_run
    for gate in ("gate_auc", "gate_logloss", "gate_calibration", "gate_onnx_parity", "gate_latency"):
        assert gate in checks, gate
        history = _graphql(stack, CHECK_EXECUTIONS, {"key": {"path": ["challenger_evaluation"]}, "check": gate})
        by_run = {e["runId"]: e for e in history["assetCheckExecutions"]}
        assert by_run[last_good.run_id]["status"] == "SUCCEEDED" and by_run[last_good.run_id]["evaluation"]["success"], gate
        assert by_run[blocked.run_id]["status"] == "EXECUTION_FAILED", gate
    assert "Execution failed" in " ".join(checks.split())

    monitored = _serve_replay_and_monitor(stack, instance, report.days[-1], repo, tmp_path)
    print(f"served and monitored {report.days[-1]}: {monitored}")
    print(f"screenshots: {tmp_path / 'asset-graph.png'} {tmp_path / 'backfill.png'} {tmp_path / 'gates.png'} "
          f"{tmp_path / 'monitor.png'}")


def _champion_line(stdout: str) -> tuple[str, float]:
    match = re.search(r"Champion: genrank-ctr v(\d+) \(trained on [^,]+, [^,]+, out-of-time AUC ([0-9.]+)\)", stdout)
    assert match, stdout[-2000:]
    return match.group(1), float(match.group(2))


def _assert_same_results(stack: Stack, reference_home: Path, reference_stdout: str, days: list[str]) -> None:
    """What `genrank run` produced: the sequence store and the samples; the teacher's cached logits (within 1e-6:
    the same seeds in another process); in the server's registry the same versions, inputs and decisions, their
    artifacts only through the server, and the champion `genrank run` printed (out-of-time AUCs within
    AUC_TOLERANCE of single-process training's)."""
    home = stack.home
    assert any(home.glob("stack/spark-work/app-*/0/stderr"))   # the events job ran on the standalone cluster
    for dataset in ("user_sequences", "training_samples"):
        for day in days:
            pd.testing.assert_frame_equal(pd.read_parquet(home / "lake" / dataset / f"date={day}"),
                                          pd.read_parquet(reference_home / "lake" / dataset / f"date={day}"),
                                          obj=f"{dataset} {day}")
    logits = sorted(p.parent.name for p in (reference_home / "lake" / "teacher_logits").glob("date=*/part-0.parquet"))
    assert logits and logits == sorted(p.parent.name for p in (home / "lake" / "teacher_logits").glob("date=*/part-0.parquet"))
    for part in logits:
        ours = pd.read_parquet(home / "lake" / "teacher_logits" / part / "part-0.parquet")
        theirs = pd.read_parquet(reference_home / "lake" / "teacher_logits" / part / "part-0.parquet")
        assert list(ours["impression_id"]) == list(theirs["impression_id"])
        np.testing.assert_allclose(ours["p"], theirs["p"], atol=1e-6)

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
    version, auc = _champion_line(reference_stdout)
    assert champion is not None and str(champion.version) == version
    assert abs(float(champion.tags["oot_auc"]) - auc) <= AUC_TOLERANCE
    assert not (home / "mlartifacts").exists()
    assert any((home / "stack" / "mlartifacts").rglob("model.onnx"))


def _serve_replay_and_monitor(stack: Stack, instance: dg.DagsterInstance, day: str, repo: dict, tmp_path: Path) -> str:
    """The champion served as users meet it: `genrank serve` as a process on the stack's home, reading the champion
    from the tracking server and histories from the online store; `genrank replay` sending the day's first ad
    requests to it over HTTP, its prediction log then read by serving_monitor in a run the daemon executes (an
    asset backfill launched as the UI launches it). The monitor sees the day as served, with no skew, and its three
    checks are on the asset's page in headless Chromium."""
    home, env = stack.home, {**os.environ, **stack.pipeline_env()}
    champion = reg.default_registry(home, env["MLFLOW_TRACKING_URI"]).by_alias(reg.CTR, "champion")
    user = pd.read_parquet(home / "lake" / "training_samples" / f"date={day}", columns=["user_id"])["user_id"].iloc[0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = Service("genrank-serve", [str(BIN / "genrank"), "serve", "--home", str(home), "--port", str(port)],
                      {**env, "GENRANK_SERVE_THREADS": "1"}, stack.folder)
    try:
        service.wait_ready(f"{url}/healthz", timeout_s=300)
        body = _score(port, {"user_id": user, "candidates": [{"ad_id": "ad-1", "surface": "feed"}]})
        assert body["model_version"] == str(champion.version) and body["history_source"] == "store"
        assert 0 < body["scores"][0]["p"][0] < 1
        replayed = subprocess.run([str(BIN / "genrank"), "replay", "--day", day, "--url", url, "--home", str(home),
                                   "--max-requests", "40"], env=env, capture_output=True, text=True, timeout=600)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    finally:
        service.stop()   # SIGTERM: the service drains its prediction log on the way out
    sent, ok = map(int, re.search(r"sent (\d+)\s+ok (\d+)", replayed.stdout).groups())
    assert sent == 40 and ok > 0, replayed.stdout

    launched = _graphql(stack, BACKFILL, {"params": {"assetSelection": [{"path": ["serving_monitor"]}],
                                                     "partitionNames": [day], "title": f"serving monitor {day}"}})
    backfill_id = launched["launchPartitionBackfill"].get("backfillId")
    assert backfill_id, launched
    _wait_until(lambda: _backfill_runs_finished(instance, backfill_id, 1), stack, 900,
                "the serving_monitor backfill's run did not finish")
    [record] = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey("serving_monitor"), asset_partitions=[day]), limit=1).records
    run = instance.get_run_by_id(record.run_id)
    assert run.tags.get("dagster/backfill") == backfill_id and run.status == dg.DagsterRunStatus.SUCCESS
    metadata = record.asset_materialization.metadata
    # (the scoring request above is logged under today's date, not the replayed day's)
    assert metadata["served"].value is True and metadata["logged_requests"].value == ok
    # the run's own evaluations (the GraphQL execution history of a partitioned check also lists planned rows)
    evaluations = {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
                   for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)}
    assert sorted(evaluations) == ["drift", "live_calibration", "skew"], evaluations
    assert evaluations["skew"].passed, evaluations["skew"].description
    statuses = {name: "passed" if e.passed else f"failed ({e.severity.value})" for name, e in evaluations.items()}
    page = " ".join(browse(f"http://127.0.0.1:{stack.ports.dagster}/assets/serving_monitor?view=checks",
                           tmp_path / "monitor.png").split())
    assert all(check in page for check in statuses), page[:2000]
    return f"{ok}/{sent} requests scored and logged; checks {statuses}"


def _versions(registry: reg.Registry, name: str) -> dict[str, dict[str, str]]:
    """Version (as a string: a tracking server gives strings, the SQLite store ints) -> tags."""
    return {str(v.version): dict(v.tags) for v in registry.client.search_model_versions(f"name='{name}'")}


def _score(port: int, payload: dict) -> dict:
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
