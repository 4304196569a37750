"""The landing sensor against real instances: it requests only what is new, one day at a time, in order,
and never chokes on a bad landing entry."""

from __future__ import annotations

import datetime as dt
import gzip
import shutil
from pathlib import Path

import dagster as dg
import pytest

from pipelines import operating
from assets.resources import GenrankPaths
from pipelines.sensors import landing_sensor
from transforms import landing
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


def _evaluate(home: Path, instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"paths": GenrankPaths(home=str(home))}) as ctx:
        return landing_sensor(ctx)


def _copy_home(src: Path, dst: Path) -> dg.DagsterInstance:
    """A copy of a built home (file times kept, as the landing fingerprint stats them) and its instance."""
    copy_home(src, dst)
    return dg.DagsterInstance.from_config(str(dst / "dagster_home"))


@pytest.fixture(scope="module")
def built_home(tiny_pipeline, tmp_path_factory):
    """A snapshot of the home `genrank run` built over the whole tiny world."""
    home, report, _ = tiny_pipeline
    snapshot = tmp_path_factory.mktemp("sensor") / "home"
    _copy_home(home, snapshot)
    return snapshot, report


def test_a_home_built_by_genrank_run_gets_no_run_request(built_home, tmp_path):
    home, report = built_home
    instance = _copy_home(home, tmp_path / "home")
    result = _evaluate(tmp_path / "home", instance)
    assert result.run_requests == []
    assert result.skip_reason.skip_message == f"all {len(report.days)} landed day(s) are done"
    # the raw_logs report is not a run: every landed day is reported once, then not again
    assert sorted(e.partition for e in result.asset_events) == report.days
    assert _evaluate(tmp_path / "home", instance, result.cursor).asset_events == []


def test_a_new_day_is_requested_once_and_first_the_day_it_completes(built_home, tmp_path):
    """Landing D+1 changes the inputs of D, which ran after its grace period without them: D runs again
    first, then D+1; each request carries a run key of its content, so it is requested once."""
    home, report = built_home
    copy = tmp_path / "home"
    instance = _copy_home(home, copy)
    last = report.days[-1]
    new_day = (dt.date.fromisoformat(last) + dt.timedelta(days=1)).isoformat()
    shutil.copytree(landing.day_dir(copy, last), landing.day_dir(copy, new_day))
    (landing.day_dir(copy, new_day) / landing.SUCCESS_MARKER).write_text(
        (landing.day_dir(copy, last) / landing.SUCCESS_MARKER).read_text().replace(last, new_day))

    plan = operating.plan_next_day(instance, copy, dt.datetime.now(dt.timezone.utc), 6.0)
    assert plan.request is not None and plan.request.day == last and not plan.request.next_day_missing
    assert "changed since its last run" in plan.reason
    result = _evaluate(copy, instance)
    assert [r.partition_key for r in result.run_requests] == [last]
    assert result.run_requests[0].run_key == plan.request.run_key
    assert result.run_requests[0].tags[operating.FINGERPRINT_TAG] == plan.request.fingerprint


def test_a_replaced_file_is_requested_exactly_once(built_home, tmp_path):
    home, report = built_home
    copy = tmp_path / "home"
    instance = _copy_home(home, copy)
    day = report.days[1]
    impressions = landing.day_dir(copy, day) / "impressions-00000.jsonl.gz"
    content = gzip.decompress(impressions.read_bytes())
    impressions.write_bytes(gzip.compress(content, mtime=1))   # same lines, a new file (as a re-upload is)
    result = _evaluate(copy, instance)
    # day-1 read D+1's clicks, so it runs first; the sensor starts one day per evaluation
    assert [r.partition_key for r in result.run_requests] == [report.days[0]]
    # once that run is queued nothing else starts, and a request for the same content is never made twice
    run = instance.create_run_for_job(
        job_def=_daily_job(), tags={**result.run_requests[0].tags, "dagster/partition": report.days[0]})
    busy = _evaluate(copy, instance)
    assert busy.run_requests == [] and run.run_id[:8] in busy.skip_reason.skip_message
    instance.report_run_failed(run)
    blocked = operating.plan_next_day(instance, copy, dt.datetime.now(dt.timezone.utc), 6.0)
    assert blocked.request is None and blocked.reason.startswith(f"{report.days[0]} is blocked")


def _daily_job():
    from pipelines.definitions import defs

    return defs.resolve_job_def("daily_job")


def test_bad_landing_entries_are_named_and_skipped(tmp_path):
    root = tmp_path
    landing.write_day(root, "2026-01-01", {k: [] for k in landing.FILE_KINDS})
    incomplete = landing.write_day(root, "2026-01-02", {k: [] for k in landing.FILE_KINDS})
    (incomplete / landing.SUCCESS_MARKER).unlink()
    broken = landing.write_day(root, "2026-01-03", {k: [] for k in landing.FILE_KINDS})
    (broken / landing.SUCCESS_MARKER).write_text("{not json")
    (root / "landing" / "date=yesterday").mkdir()
    (root / "landing" / "notes.txt").write_text("hello")
    plan = operating.plan_next_day(dg.DagsterInstance.ephemeral(), root, dt.datetime.now(dt.timezone.utc), 6.0)
    problems = "\n".join(plan.problems)
    assert f"{incomplete / landing.SUCCESS_MARKER}: missing" in problems
    assert f"{broken / landing.SUCCESS_MARKER}: not a JSON document" in problems
    assert "date=yesterday: not a landing day" in problems and "notes.txt: not a landing day" in problems
    # 2026-01-01 is the only usable day; its D+1 never completed and the grace period is long over
    assert plan.request is not None and plan.request.day == "2026-01-01" and plan.request.next_day_missing
    result = _evaluate(root, dg.DagsterInstance.ephemeral())   # the tick itself does not fail
    assert [r.partition_key for r in result.run_requests] == ["2026-01-01"]


def test_the_newest_day_waits_for_its_late_clicks(tmp_path):
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    landing.write_day(tmp_path, today, {k: [] for k in landing.FILE_KINDS})
    plan = operating.plan_next_day(dg.DagsterInstance.ephemeral(), tmp_path, dt.datetime.now(dt.timezone.utc), 6.0)
    assert plan.request is None and plan.reason.startswith(f"{today} waits for landing")


def test_teacher_cadence_is_the_runs_rule():
    from assets.training import teacher_due

    days = ["2026-01-01", "2026-01-02"]
    assert teacher_due("2026-01-02", days[:1], None, 7, 2) == (False, "1 day(s) of samples before 2026-01-02; the first teacher needs 2")
    assert teacher_due("2026-01-03", days, None, 7, 2)[0]
    window = "2026-01-01..2026-01-02"          # trained for 2026-01-03
    assert not teacher_due("2026-01-09", days, window, 7, 2)[0]
    assert teacher_due("2026-01-10", days, window, 7, 2)[0]
    assert teacher_due("2026-01-06", days, window, 3, 2)[0] and not teacher_due("2026-01-05", days, window, 3, 2)[0]



def test_a_day_stopped_by_a_blocking_check_stays_blocked_with_its_reason(tmp_path):
    """A day whose every line is garbage fails a blocking events check under `genrank run`: its run is
    tagged with the checks and the reason and its run retry is off (the daemon would not retry it), the
    sensor calls it blocked, and a corrected file releases it."""
    import os
    import subprocess
    import sys

    day = "2026-01-05"
    garbage = {kind: [f'{{"broken": {i}' for i in range(50)] for kind in landing.FILE_KINDS}
    landing.write_day(tmp_path, day, garbage)
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "MLFLOW_TRACKING_URI")}
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--home", str(tmp_path)],
                         env={**env, "GENRANK_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 1 and "FAILED" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]

    instance = dg.DagsterInstance.from_config(str(tmp_path / "dagster_home"))
    [run] = instance.get_runs(dg.RunsFilter(job_name="daily_job"))
    assert run.status == dg.DagsterRunStatus.FAILURE
    assert run.tags[operating.BLOCKED_BY_TAG].startswith("events:") and run.tags[operating.BLOCKED_REASON_TAG]
    assert run.tags["dagster/retry_on_asset_or_op_failure"] == "false"   # what stops the daemon's retry
    assert run.tags["dagster/will_retry"] == "false"
    blocked = operating.plan_next_day(instance, tmp_path, dt.datetime.now(dt.timezone.utc), 6.0)
    assert blocked.request is None and blocked.reason.startswith(f"{day} is blocked")
    assert run.tags[operating.BLOCKED_BY_TAG] in blocked.reason and "quarantine-file" in blocked.reason

    landing.write_day(tmp_path, day, {kind: [] for kind in landing.FILE_KINDS})   # the source re-delivers the day
    released = operating.plan_next_day(instance, tmp_path, dt.datetime.now(dt.timezone.utc), 6.0)
    assert released.request is not None and released.request.day == day
