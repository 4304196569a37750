"""The Dagster code location: loads, validates, and its landing sensor asks for the right runs."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import dagster as dg

from assets.resources import GenrankPaths
from pipelines.sensors import landing_sensor
from tests.conftest import REPO
from transforms import landing


def test_definitions_load_and_validate():
    from pipelines.definitions import defs

    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"raw_logs", "events", "user_sequences", "training_samples", "position_buckets", "teacher_model",
            "teacher_logits", "student_candidate", "challenger_evaluation", "promotion"} <= keys
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"daily_job", "teacher_job"}
    # the landing sensor drives the daily runs; the fixed-time schedule is its stopped alternative
    schedules = {s.name: s for s in defs.schedules}
    assert schedules["daily_schedule"].default_status == dg.DefaultScheduleStatus.STOPPED
    assert landing_sensor.default_status == dg.DefaultSensorStatus.RUNNING
    # every launcher runs the same job, the teacher included (it retrains inside the run when due)
    daily = defs.resolve_job_def("daily_job")
    assert dg.AssetKey("teacher_model") in daily.asset_layer.executable_asset_keys
    assert daily.tags["genrank/lane"] == "daily" and "mark_blocked_run" in {h.name for h in daily.hook_defs}


def test_the_daily_student_depends_on_its_previous_day():
    """student_candidate(D) warm-starts from D-1: the self-dependency orders a UI backfill's daily runs."""
    from pipelines.definitions import defs

    key = dg.AssetKey("student_candidate")
    graph = defs.resolve_asset_graph()
    assert key in graph.get(key).parent_keys
    mapping = defs.resolve_assets_def(key).get_partition_mapping(key)
    assert isinstance(mapping, dg.TimeWindowPartitionMapping) and (mapping.start_offset, mapping.end_offset) == (-1, -1)


def test_workspace_loads_with_the_dagster_cli(tmp_path):
    env = {**os.environ, "GENRANK_HOME": str(tmp_path), "DAGSTER_HOME": str(tmp_path / "dh")}
    (tmp_path / "dh").mkdir()
    out = subprocess.run([str(REPO / ".venv" / "bin" / "dagster") if (REPO / ".venv").exists() else "dagster",
                          "definitions", "validate", "-w", "workspace.yaml"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "passed validation" in out.stderr + out.stdout


def _land(root: Path, day: str) -> None:
    landing.write_day(root, day, {k: [landing.dumps({"n": 1})] for k in landing.FILE_KINDS})


def test_sensor_reports_landed_days_and_requests_the_first_ready_day(tmp_path):
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        _land(tmp_path, day)
    today = dt.datetime.now(dt.timezone.utc).date()
    _land(tmp_path, today.isoformat())  # today's day cannot be ready: tomorrow's late clicks are due
    instance = dg.DagsterInstance.ephemeral()
    with dg.build_sensor_context(instance=instance, resources={"paths": GenrankPaths(home=str(tmp_path))}) as ctx:
        result = landing_sensor(ctx)
    reported = sorted(e.partition for e in result.asset_events)
    assert reported == ["2026-01-01", "2026-01-02", "2026-01-03", today.isoformat()]
    # one day per evaluation, the oldest first: the next is decided once this one has run
    [request] = result.run_requests
    assert request.partition_key == "2026-01-01" and request.tags["genrank/next_day_missing"] == "false"
    assert request.run_key.startswith("2026-01-01:")
    # a later evaluation reports nothing twice
    with dg.build_sensor_context(instance=instance, cursor=result.cursor,
                                 resources={"paths": GenrankPaths(home=str(tmp_path))}) as ctx:
        again = landing_sensor(ctx)
    assert again.asset_events == []
    assert sorted(json.loads(again.cursor)) == reported


def test_incomplete_day_is_not_reported(tmp_path):
    path = landing.write_day(tmp_path, "2026-01-05", {k: [] for k in landing.FILE_KINDS})
    (path / landing.SUCCESS_MARKER).unlink()
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(),
                                 resources={"paths": GenrankPaths(home=str(tmp_path))}) as ctx:
        result = landing_sensor(ctx)
    assert result.asset_events == [] and result.run_requests == []


def test_the_local_instance_retries_the_daily_job_and_genrank_ui_opens_it(tmp_path, monkeypatch):
    """Open-source Dagster ignores a job's dagster/max_retries tag unless the instance enables run
    retries: the instance `genrank run` records into and `genrank ui` serves must enable them."""
    from pipelines import cli
    from pipelines.definitions import defs
    from pipelines.runner import local_dagster_home

    instance = dg.DagsterInstance.from_config(str(local_dagster_home(tmp_path)))
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 0
    assert defs.resolve_job_def("daily_job").tags["dagster/max_retries"] == "1"

    launched = {}
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setattr(cli.os, "execvpe", lambda f, argv, env: launched.update(argv=argv, env=env))
    cli.main(["ui", "--home", str(tmp_path), "--port", "3999"])
    assert launched["argv"][1:3] == ["dev", "-w"] and launched["argv"][-2:] == ["--port", "3999"]
    assert launched["env"]["DAGSTER_HOME"] == str(tmp_path / "dagster_home")
    assert launched["env"]["GENRANK_HOME"] == str(tmp_path)


def test_the_production_instance_config_is_valid_and_keeps_the_local_rules():
    """deploy/dagster.yaml against Dagster's instance schema and DockerRunLauncher's config schema (no
    Postgres or Docker needed); it keeps what the local instance guarantees (run retries, one training
    step at a time) and passes every pipeline variable on to the run containers."""
    import yaml
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config_schema, validate_concurrency_config
    from dagster_docker import DockerRunLauncher

    from contracts import settings
    from pipelines.runner import INSTANCE_YAML

    prod = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    checked = validate_config(dagster_instance_config_schema(), prod)
    assert checked.success, [e.message for e in checked.errors]
    validate_concurrency_config(prod)   # the cross-field rules Dagster applies when it loads the instance
    launcher = prod["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_docker", "DockerRunLauncher")
    checked = validate_config(DockerRunLauncher.config_type(), launcher["config"])
    assert checked.success, [e.message for e in checked.errors]
    assert "postgres_db" in prod["storage"]["postgres"]

    local = yaml.safe_load(INSTANCE_YAML)
    assert prod["run_retries"] == local["run_retries"] and prod["concurrency"]["pools"] == local["concurrency"]["pools"]
    assert prod["concurrency"]["runs"]["tag_concurrency_limits"] == local["concurrency"]["runs"]["tag_concurrency_limits"]
    passed = {v.split("=", 1)[0] for v in launcher["config"]["env_vars"]}
    # the service's variables and the test suite's CI are not the pipeline runs'
    pipeline_vars = {k for k in settings.VARIABLES
                     if not k.startswith(("GENRANK_SERVE_", "GENRANK_STACK_", "PROMETHEUS_")) and k != "CI"}
    assert pipeline_vars <= passed, pipeline_vars - passed
