"""The `events` Dagster asset: tiny simulated world end to end, blocking checks, grace period."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import dagster as dg
import pytest

from assets.events import RAW_LOGS_MAPPING, events, next_day_decision
from pipelines.resources import GenrankPaths
from quality.events import EVENTS_CHECKS
from tests.spark.spark_helpers import expected_vs_actual
from transforms import landing

pytestmark = pytest.mark.spark


def materialize_day(home, day, spark_resource, **kw):
    return dg.materialize([events], partition_key=day,
                          resources={"spark": spark_resource, "paths": GenrankPaths(home=str(home))}, **kw)


def checks_of(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_asset_definition():
    spec_by_name = {s.name: s for s in events.check_specs}
    assert set(spec_by_name) == set(EVENTS_CHECKS.names())
    assert spec_by_name["events_not_empty"].blocking and spec_by_name["events_row_accounting"].blocking
    assert not spec_by_name["events_ctr_drift"].blocking
    assert events.group_names_by_key[dg.AssetKey("events")] == "ingest"
    assert dg.AssetKey("raw_logs") in events.dependency_keys
    assert RAW_LOGS_MAPPING.start_offset == -1 and RAW_LOGS_MAPPING.end_offset == 1
    assert set(events.required_resource_keys) >= {"spark", "paths"}


def test_next_day_decision_grace_period():
    day = "2026-05-01"
    end_of_next = dt.datetime(2026, 5, 3, tzinfo=dt.timezone.utc)
    assert next_day_decision(day, True, end_of_next - dt.timedelta(days=1), 6) == "use"
    assert next_day_decision(day, False, end_of_next + dt.timedelta(hours=5), 6) == "wait"
    assert next_day_decision(day, False, end_of_next + dt.timedelta(hours=6), 6) == "skip"


def test_tiny_world_every_day_materialises_with_checks_passing_and_manifest_counts(tiny_world, tmp_path, shared_spark_resource):
    root, _report = tiny_world
    shutil.copytree(root / "landing", tmp_path / "landing")  # the shared world stays read-only
    manifest = json.loads((root / "simulator" / "manifest.json").read_text())
    mismatches, failed = {}, {}
    for day in manifest["days"]:
        result = materialize_day(tmp_path, day, shared_spark_resource)
        assert result.success
        md = result.asset_materializations_for_node("events")[0].metadata
        accounting = md["accounting"].value
        mismatches.update(expected_vs_actual(manifest, day, accounting))
        assert md["accounting_closes"].value is True
        assert md["events_rows"].value > 0 and md["rows_per_s"].value > 0
        for name, ev in checks_of(result).items():
            if not ev.passed:
                failed[f"{day}/{name}"] = ev.description
        assert set(checks_of(result)) == set(EVENTS_CHECKS.names())
        assert md["next_day_included"].value == (day != manifest["days"][-1])
    assert mismatches == {}, "quarantine/duplicate counts differ from the simulator manifest"
    assert failed == {}


def test_all_garbage_day_fails_the_blocking_check_naming_reason_and_count(tmp_path, shared_spark_resource):
    day = "2026-04-10"
    landing.write_day(tmp_path, day, {"impressions": ['{"request_id": 7, "impress'] * 12,
                                      "clicks": [], "behaviors": ['{"user_id": 3, "ts_ms": 1}'] * 3})
    result = materialize_day(tmp_path, day, shared_spark_resource, raise_on_error=False)
    assert not result.success  # a failed blocking check fails the step: nothing downstream runs
    assert "blocking asset check failed" in result.get_step_failure_events()[0].event_specific_data.error.message
    checks = checks_of(result)
    not_empty = checks["events_not_empty"]
    assert not not_empty.passed and not_empty.severity == dg.AssetCheckSeverity.ERROR
    assert "0 of 15 input lines accepted" in not_empty.description
    assert "malformed_json=12" in not_empty.description and "missing_key=3" in not_empty.description
    assert not_empty.metadata["failing_expectation"].value == "expect_table_row_count_to_be_between"
    assert checks["events_row_accounting"].passed  # nothing disappeared: all 15 lines are quarantined
    rate = checks["events_quarantine_rate"]
    assert not rate.passed and rate.severity == dg.AssetCheckSeverity.WARN


def test_newest_day_waits_for_next_day_within_the_grace_period(tmp_path, shared_spark_resource):
    day = (dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)).isoformat()  # newest partition
    landing.write_day(tmp_path, day, {"impressions": [], "clicks": [], "behaviors": []})
    result = materialize_day(tmp_path, day, shared_spark_resource, raise_on_error=False)
    assert not result.success
    message = result.get_step_failure_events()[0].event_specific_data.error.message
    assert "waiting for landing" in message and "runs without it 6 h after" in message
    assert not (tmp_path / "lake").exists()
