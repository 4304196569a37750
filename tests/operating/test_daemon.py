"""The operating mode under real services, on one fresh home of the tiny world: a range backfill launched
the way the UI launches it (GraphQL, against a real dagster-webserver), then the landing sensor driving
the daily job through a real dagster-daemon, compared with `genrank run` over the same days (the
session's tiny_pipeline). One scenario, not two, because each daemon-driven day costs a minute or more on
2 cores; it also shows what two would not: the sensor does not rerun days a backfill has done. The
services bind to 127.0.0.1 and are stopped by PID."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

from deploy import registry as reg
from deploy.stack import BIN, free_port
from pipelines import operating
from tests.operating.services import LOCATION, DagsterStack, Service, browse
from transforms import landing

pytestmark = pytest.mark.slow

FLAKY_LOCATION = Path(__file__).with_name("flaky_location.py")
RUN_ENV = {
    "GENRANK_LATENCY_BUDGET_MS": "1e9",   # as tiny_pipeline: wall-clock time must not decide a test
    "GENRANK_SENSOR_INTERVAL_S": "5",
    "GENRANK_START_DATE": "2026-01-01",
}


def _wait_until(predicate, stack: DagsterStack, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(5)
    raise TimeoutError(f"{what} after {timeout_s:.0f} s\n{stack.logs()}")


def _daily_runs(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    return sorted(instance.get_run_records(dg.RunsFilter(job_name="daily_job")), key=lambda r: r.start_time or 0)


def _assert_serial_and_in_date_order(records: list[dg.RunRecord]) -> list[str]:
    """No two runs in progress at once (start/end times from the instance); days in date order."""
    for earlier, later in zip(records, records[1:]):
        assert earlier.end_time <= later.start_time, (earlier.dagster_run.run_id, later.dagster_run.run_id)
    days = [r.dagster_run.tags["dagster/partition"] for r in records]
    assert days == sorted(days), days
    return days


def _champion_line(stdout: str) -> tuple[str, str]:
    match = re.search(r"Champion: genrank-ctr v(\d+) \(trained on [^,]+, [^,]+, out-of-time AUC ([0-9.]+)\)", stdout)
    assert match, stdout[-2000:]
    return match.group(1), match.group(2)


def _assert_same_results(home: Path, reference_home: Path, reference_stdout: str, days: list[str]) -> None:
    """What `genrank run` produced: the sequence store, the samples, the teacher's cached logits (within
    1e-6: the same seeds in another process) and the champion with its out-of-time AUC."""
    for dataset in ("user_sequences", "training_samples"):
        for day in days:
            ours = pd.read_parquet(home / "lake" / dataset / f"date={day}")
            theirs = pd.read_parquet(reference_home / "lake" / dataset / f"date={day}")
            pd.testing.assert_frame_equal(ours, theirs, obj=f"{dataset} {day}")
    logits = sorted(p.parent.name for p in (reference_home / "lake" / "teacher_logits").glob("date=*/part-0.parquet"))
    assert logits and logits == sorted(p.parent.name for p in (home / "lake" / "teacher_logits").glob("date=*/part-0.parquet"))
    for part in logits:
        ours = pd.read_parquet(home / "lake" / "teacher_logits" / part / "part-0.parquet")
        theirs = pd.read_parquet(reference_home / "lake" / "teacher_logits" / part / "part-0.parquet")
        assert list(ours["impression_id"]) == list(theirs["impression_id"])
        np.testing.assert_allclose(ours["p"], theirs["p"], atol=1e-6)
    champion = reg.default_registry(home).by_alias(reg.CTR, "champion")
    assert champion is not None
    assert (str(champion.version), champion.tags["oot_auc"]) == _champion_line(reference_stdout)


def _sensor_ticks(instance: dg.DagsterInstance) -> list:
    """The landing sensor's ticks, newest first."""
    [state] = [s for s in instance.all_instigator_state() if s.name == "landing_sensor"]
    return instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1000)


def _latest_sensor_skip(instance: dg.DagsterInstance) -> str:
    return _sensor_ticks(instance)[0].skip_reason or ""


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
def test_a_ui_backfill_then_the_landing_sensor_run_the_days_in_order_under_the_daemon(tiny_pipeline, tmp_path):
    """One instance, as an operator meets it, under a real dagster-daemon and dagster-webserver:

    1. The operator pauses the landing sensor in the UI; the four tiny days land at once with a fifth whose
       every line is garbage; a daily_job backfill of the first two days is launched through the webserver's
       GraphQL API (what the UI's "Launch backfill" sends): one run per day, in date order.
    2. The sensor is started again. It skips the two backfilled days (done, whoever ran them) and starts
       one daily run at a time: day 3's dbt step fails once, transiently, and is retried from that step;
       the first teacher trains inside day 3's run; the garbage day fails a blocking events check, is not
       retried, and stays blocked with its reason while the sensor keeps ticking.
    3. The four days give what `genrank run` gives; headless Chromium renders the asset graph, the
       backfill page and the gate checks of challenger_evaluation.
    4. `genrank serve` runs the champion as a process, `genrank replay` sends the last day's requests to it over
       HTTP, and the day's serving_monitor runs under the daemon (an asset backfill, as the UI launches one):
       served, no skew, its checks on the asset's page."""
    reference_home, report, reference_stdout = tiny_pipeline
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "failed-once"
    backfilled, sensed = report.days[:2], report.days[2:]
    garbage_day = (dt.date.fromisoformat(report.days[-1]) + dt.timedelta(days=1)).isoformat()
    stack = DagsterStack(home, FLAKY_LOCATION, {**RUN_ENV, "GENRANK_TEST_FAIL_ONCE": f"{sensed[0]}:{marker}"},
                         webserver=True)
    try:
        repo = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
        sensor_selector = {**repo, "sensorName": "landing_sensor"}
        sensor = stack.graphql(SENSOR, {"selector": sensor_selector})["sensorOrError"]
        stopped = stack.graphql(STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
        assert stopped["stopSensor"]["instigationState"]["status"] == "STOPPED"
        # the daemon may be inside a sensor iteration that read the state before the stop: let it finish
        instance = dg.DagsterInstance.from_config(str(stack.dagster_home))
        _wait_until(lambda: all(t.status != TickStatus.STARTED for t in _sensor_ticks(instance)), stack, 300,
                    "the stopped sensor's last tick did not finish")
        # the garbage day lands with the others, so day 4 sees its D+1 (garbage clicks attribute nothing)
        # from its first run, as `genrank run` saw none: day 4 runs once
        garbage = tmp_path / "garbage"
        landing.write_day(garbage, garbage_day, {kind: [f'{{"broken": {i}' for i in range(50)] for kind in landing.FILE_KINDS})
        landing.land_days(reference_home, home, report.days, more=((garbage, garbage_day),))

        started = time.monotonic()
        launched = stack.graphql(BACKFILL, {"params": {
            "selector": {"partitionSetName": "daily_job_partition_set", "repositorySelector": repo},
            "partitionNames": backfilled, "title": "tiny world, the first days"}})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]
        _wait_until(lambda: instance.get_backfill(backfill_id).status.value in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")
                    and not instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES)),
                    stack, 1500, "the backfill did not complete")
        print(f"backfill of {len(backfilled)} days: {time.monotonic() - started:.0f} s")
        records = _daily_runs(instance)
        assert _assert_serial_and_in_date_order(records) == backfilled
        assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records), stack.logs()
        assert {r.dagster_run.tags.get("dagster/backfill") for r in records} == {backfill_id}

        started = time.monotonic()
        restarted = stack.graphql(START_SENSOR, {"selector": sensor_selector})["startSensor"]
        assert restarted["sensorState"]["status"] == "RUNNING", restarted

        def settled():
            plan = operating.plan_next_day(instance, home, dt.datetime.now(dt.timezone.utc), 6.0)
            assert " is blocked" not in plan.reason or plan.reason.startswith(garbage_day), \
                f"{plan.reason}\n{stack.logs()}"
            return plan.request is None and plan.reason.startswith(f"{garbage_day} is blocked")

        _wait_until(settled, stack, 2000, "the daemon did not finish the landed days")
        print(f"sensor-driven days: {time.monotonic() - started:.0f} s")
        records = _daily_runs(instance)
        assert _assert_serial_and_in_date_order(records) == [*backfilled, sensed[0], *sensed, garbage_day]
        assert not any(r.dagster_run.tags.get("dagster/backfill") for r in records[2:])
        assert marker.exists()
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
        _assert_same_results(home, reference_home, reference_stdout, report.days)
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
        skip = _latest_sensor_skip(instance)
        assert skip.startswith(f"{garbage_day} is blocked") and blocked.tags[operating.BLOCKED_BY_TAG] in skip, skip

        graph = browse(f"{stack.url}/asset-groups", tmp_path / "asset-graph.png")
        for group in ("ingest", "sequences", "models"):
            assert group in graph, group
        page = browse(f"{stack.url}/runs/b/{backfill_id}", tmp_path / "backfill.png")
        text = " ".join(page.split())
        assert backfill_id in text and "daily_job" in text and f"{len(backfilled)} partitions" in text
        assert "Succeeded" in text and "Join the Dagster community" not in text
        # The reviewer's view of the gates: the asset page of challenger_evaluation lists its checks. Their newest
        # execution is the garbage day's run, stopped before them, and the page says so ("Execution failed");
        # each gate's history (the page's "Execution history" tab, read through the same GraphQL API) holds the
        # passed evaluation of the last good day's run.
        checks = browse(f"{stack.url}/assets/challenger_evaluation?view=checks", tmp_path / "gates.png")
        last_good = records[-2].dagster_run
        for gate in ("gate_auc", "gate_logloss", "gate_calibration", "gate_onnx_parity", "gate_latency"):
            assert gate in checks, gate
            history = stack.graphql(CHECK_EXECUTIONS, {"key": {"path": ["challenger_evaluation"]}, "check": gate})
            by_run = {e["runId"]: e for e in history["assetCheckExecutions"]}
            assert by_run[last_good.run_id]["status"] == "SUCCEEDED" and by_run[last_good.run_id]["evaluation"]["success"], gate
            assert by_run[blocked.run_id]["status"] == "EXECUTION_FAILED", gate
        assert "Execution failed" in " ".join(checks.split())

        monitored = _serve_replay_and_monitor(stack, instance, home, report.days[-1], repo, tmp_path)
        print(f"served and monitored {report.days[-1]}: {monitored}")
        print(f"screenshots: {tmp_path / 'asset-graph.png'} {tmp_path / 'backfill.png'} {tmp_path / 'gates.png'} "
              f"{tmp_path / 'monitor.png'}")
    finally:
        stack.stop()


def _serve_replay_and_monitor(stack: DagsterStack, instance: dg.DagsterInstance, home: Path, day: str, repo: dict,
                              tmp_path: Path) -> str:
    """The champion served as users meet it: `genrank serve` as a process on the home, `genrank replay` sending
    the day's first ad requests to it over HTTP, its prediction log then read by serving_monitor in a run the
    daemon executes (an asset backfill launched as the UI launches it). The monitor sees the day as served, with
    no skew, and its three checks are on the asset's page in headless Chromium."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = Service("genrank-serve", [str(BIN / "genrank"), "serve", "--home", str(home), "--port", str(port)],
                      {**stack.env, "GENRANK_SERVE_THREADS": "1"}, stack.folder)
    try:
        service.wait_ready(f"{url}/healthz", timeout_s=120)
        replayed = subprocess.run([str(BIN / "genrank"), "replay", "--day", day, "--url", url, "--home", str(home),
                                   "--max-requests", "40"], env=stack.env, capture_output=True, text=True, timeout=600)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    finally:
        service.stop()   # SIGTERM: the service drains its prediction log on the way out
    sent, ok = map(int, re.search(r"sent (\d+)\s+ok (\d+)", replayed.stdout).groups())
    assert sent == 40 and ok > 0, replayed.stdout

    launched = stack.graphql(BACKFILL, {"params": {"assetSelection": [{"path": ["serving_monitor"]}],
                                                   "partitionNames": [day], "title": f"serving monitor {day}"}})
    backfill_id = launched["launchPartitionBackfill"].get("backfillId")
    assert backfill_id, launched
    _wait_until(lambda: instance.get_backfill(backfill_id).status.value.startswith("COMPLETED")
                and not instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES)),
                stack, 900, "the serving_monitor backfill did not complete")
    [record] = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey("serving_monitor"), asset_partitions=[day]), limit=1).records
    run = instance.get_run_by_id(record.run_id)
    assert run.tags.get("dagster/backfill") == backfill_id and run.status == dg.DagsterRunStatus.SUCCESS
    metadata = record.asset_materialization.metadata
    assert metadata["served"].value is True and metadata["logged_requests"].value == ok
    # the run's own evaluations (the GraphQL execution history of a partitioned check also lists planned rows)
    evaluations = {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
                   for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)}
    assert sorted(evaluations) == ["drift", "live_calibration", "skew"], evaluations
    assert evaluations["skew"].passed, evaluations["skew"].description
    statuses = {name: "passed" if e.passed else f"failed ({e.severity.value})" for name, e in evaluations.items()}
    page = " ".join(browse(f"{stack.url}/assets/serving_monitor?view=checks", tmp_path / "monitor.png").split())
    assert all(check in page for check in statuses), page[:2000]
    return f"{ok}/{sent} requests scored and logged; checks {statuses}"
