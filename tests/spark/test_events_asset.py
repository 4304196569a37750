"""The `events` Dagster asset: tiny simulated world end to end, blocking checks, grace period."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import pyarrow.parquet as pq
import pytest

import contracts
from assets.events import RAW_LOGS_MAPPING, events
from assets.resources import GenrankPaths
from quality.events import EVENTS_CHECKS
from tests.spark.spark_corpus import behavior, click, impression
from tests.spark.spark_helpers import expected_vs_actual
from transforms import landing
from transforms.landing import dumps

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
    assert landing.next_day_decision(day, True, end_of_next - dt.timedelta(days=1), 6) == "use"
    assert landing.next_day_decision(day, False, end_of_next + dt.timedelta(hours=5), 6) == "wait"
    assert landing.next_day_decision(day, False, end_of_next + dt.timedelta(hours=6), 6) == "skip"


def test_tiny_world_every_day_materialised_with_checks_passing_and_manifest_counts(tiny_pipeline):
    """Read from the session's `genrank run` of the tiny world (its Dagster instance): the daily processing that
    every test shares, not a second one."""
    home, _report, _ = tiny_pipeline
    manifest = json.loads((home / "simulator" / "manifest.json").read_text())
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    mismatches, failed = {}, {}
    for day in manifest["days"]:
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("events"), asset_partitions=[day]), limit=1).records
        md = record.asset_materialization.metadata
        accounting = md["accounting"].value
        mismatches.update(expected_vs_actual(manifest, day, accounting))
        assert md["accounting_closes"].value is True
        assert md["events_rows"].value > 0 and md["rows_per_s"].value > 0
        checks = {e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
                  for e in instance.all_logs(record.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
                  if e.dagster_event.event_specific_data.asset_key == dg.AssetKey("events")}
        assert set(checks) == set(EVENTS_CHECKS.names())
        failed.update({f"{day}/{name}": ev.description for name, ev in checks.items() if not ev.passed})
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
    assert checks["events_quarantine_rate"].passed  # 15 lines: below min_lines, reported but not judged


def one_bad_row_of_each_kind(day: str) -> dict[str, list[tuple[str, str]]]:
    """(line, reason) per kind: one row breaking each single-row rule a blocking events check enforces."""
    s = landing.day_start_ms(day)
    base = impression(day, 900, s + 500, 1, position=1, surface="detail")
    ok_click = click(impression(day, 0, s + 1_000, 1), s + 2_000)
    return {
        "impressions": [
            (dumps(dict(base, impression_id="x1", position=999)), "position_out_of_range"),   # 3-slot detail
            (dumps(dict(base, impression_id="x2", position=0)), "position_out_of_range"),
            (dumps(dict(base, impression_id="x3", device="toaster")), "unknown_enum"),
            (dumps(dict(base, impression_id="x4", surface="moon")), "unknown_enum"),
            (dumps(dict(base, impression_id="x5", user_id="  ")), "empty_id"),
            (dumps(dict(base, impression_id="")), "empty_id"),
            (dumps(dict(base, impression_id="x7", ts_ms=s - 1)), "ts_out_of_range"),
            (dumps(dict(base, impression_id="x8", ts_ms=s + contracts.DAY_MS)), "ts_out_of_range"),
            (dumps({k: v for k, v in dict(base, impression_id="x9").items() if k != "request_id"}), "missing_key"),
            (dumps(dict(base, impression_id="x10", position="2")), "bad_type"),
            ('{"impression_id": "x11", ', "malformed_json"),
        ],
        "clicks": [
            (dumps(dict(ok_click, click_type="poke")), "unknown_enum"),
            (dumps(dict(ok_click, dwell_ms=-5)), "negative_dwell"),
            (dumps(dict(ok_click, ad_id="")), "empty_id"),
            (dumps(click(impression(day, 1, s + 5_000, 1), s + 1_000)), "click_outside_window"),  # before it
            (dumps(click(impression(day, 7777, s, 1), s + 3_000)), "orphan_click"),
        ],
        "behaviors": [
            (dumps(behavior(s + 10, 1, 2, "jump")), "unknown_enum"),
            (dumps(dict(behavior(s + 10, 1, 2), item_id="")), "empty_id"),
            (dumps(behavior(s - 10, 1, 2)), "ts_out_of_range"),
        ],
    }


def good_day(day: str, n_imps: int, n_beh: int) -> dict[str, list[str]]:
    s = landing.day_start_ms(day)
    imps = [impression(day, k, s + 1_000 * (k + 1), 1 + k % 7, position=1 + k % 3, surface=("feed", "search", "detail")[k % 3])
            for k in range(n_imps)]
    clicks = [click(i, i["ts_ms"] + 500) for i in imps[::10]]
    return {"impressions": [dumps(i) for i in imps], "clicks": [dumps(c) for c in clicks],
            "behaviors": [dumps(behavior(s + 7 * k, 1 + k % 5, k)) for k in range(n_beh)]}


def test_one_bad_row_of_each_kind_is_quarantined_and_the_day_completes(tmp_path, shared_spark_resource):
    day = "2026-04-12"
    lines, bad = good_day(day, 500, 100), one_bad_row_of_each_kind(day)
    for kind, rows in bad.items():
        lines[kind] += [line for line, _ in rows]
    landing.write_day(tmp_path, day, lines)
    result = materialize_day(tmp_path, day, shared_spark_resource)
    assert result.success
    failed = {n: e.description for n, e in checks_of(result).items() if not e.passed}
    assert failed == {}  # blocking and warning: one bad row per rule is no rate problem
    md = result.asset_materializations_for_node("events")[0].metadata
    assert md["accounting_closes"].value is True and md["quarantined"].value == sum(map(len, bad.values()))
    q = pq.read_table(tmp_path / "lake" / "quarantine" / f"date={day}").to_pylist()
    assert sorted((r["kind"], r["raw"], r["reason"]) for r in q) == sorted(
        (kind, line, reason) for kind, rows in bad.items() for line, reason in rows)


def test_thirty_percent_bad_rows_block_the_day_naming_reason_and_share(tmp_path, shared_spark_resource):
    day = "2026-04-13"
    lines = good_day(day, 140, 60)
    s = landing.day_start_ms(day)
    lines["impressions"] += [dumps(impression(day, 1000 + k, s + k, 1, position=999, surface="detail")) for k in range(60)]
    landing.write_day(tmp_path, day, lines)
    result = materialize_day(tmp_path, day, shared_spark_resource, raise_on_error=False)
    assert not result.success
    rate = checks_of(result)["events_quarantine_rate"]
    assert not rate.passed and rate.severity == dg.AssetCheckSeverity.ERROR
    assert "impressions position_out_of_range: 60 of 200 lines, 30.0% > 10.0%" in rate.description
    assert checks_of(result)["events_row_accounting"].passed and checks_of(result)["events_position_in_range"].passed


def test_newest_day_waits_for_next_day_within_the_grace_period(tmp_path, shared_spark_resource):
    day = (dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)).isoformat()  # newest partition
    landing.write_day(tmp_path, day, {"impressions": [], "clicks": [], "behaviors": []})
    result = materialize_day(tmp_path, day, shared_spark_resource, raise_on_error=False)
    assert not result.success
    message = result.get_step_failure_events()[0].event_specific_data.error.message
    assert "waiting for landing" in message and "runs without it 6 h after" in message
    assert not (tmp_path / "lake").exists()
