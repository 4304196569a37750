"""The GX-based quality framework and the events checks, on hand-written partitions (no Spark)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quality.events import (EVENTS_CHECKS, EventsThresholds, QuarantineRates, RateLimit, ctr_band,
                            trailing_stats, validate_events)
from quality.framework import CheckDef, DatasetChecks, to_check_result, to_check_results, validate_frame
from contracts import EVENT_COLUMNS

DAY = "2026-06-02"
START = int(dt.datetime(2026, 6, 2, tzinfo=dt.timezone.utc).timestamp() * 1000)
ARROW = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32()}


def rows(n_imps: int = 20, n_clicked: int = 2, n_beh: int = 5, day_start: int = START) -> list[dict]:
    out = []
    for i in range(n_imps):
        clicked = i < n_clicked
        out.append(dict(event_kind="impression", user_id=f"u{i % 4}", ts_ms=day_start + 1000 * i, request_id=f"r{i}",
                        impression_id=f"i{i}", item_id=f"a{i}", ad_id=f"a{i}", campaign_id="c", advertiser_id="v",
                        category_id="k", brand_id="b", position=1 + i % 5, surface="feed", device="ios", action=None,
                        label=int(clicked), click_type="follow" if clicked else None,
                        dwell_ms=100 if clicked else None, click_ts_ms=day_start + 1000 * i + 50 if clicked else None))
    for j in range(n_beh):
        out.append(dict(event_kind="behavior", user_id="u1", ts_ms=day_start + 500 * j, request_id=None,
                        impression_id=None, item_id=f"it{j}", ad_id=None, campaign_id=None, advertiser_id=None,
                        category_id="k", brand_id="b", position=None, surface=None, device=None, action="view",
                        label=None, click_type=None, dwell_ms=None, click_ts_ms=None))
    return out


def write(base: Path, day: str, data: list[dict], types: dict[str, str] = EVENT_COLUMNS) -> Path:
    path = base / f"date={day}"
    path.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([(c, ARROW[t]) for c, t in types.items()])
    pq.write_table(pa.Table.from_pylist(data, schema=schema), path / "part-00000.parquet")
    return path


def accounting(input_lines: int, accepted_imps: int, accepted_beh: int, quarantined: dict | None = None) -> dict:
    q = quarantined or {}
    nq = sum(q.values())
    return {
        "impressions": {"input_lines": input_lines - accepted_beh, "accepted": accepted_imps, "quarantined": nq,
                        "duplicates": input_lines - accepted_beh - accepted_imps - nq, "quarantined_by_reason": q},
        "behaviors": {"input_lines": accepted_beh, "accepted": accepted_beh, "quarantined": 0, "duplicates": 0},
    }


def by_name(outcomes):
    return {o.check: o for o in outcomes}


def test_clean_partition_passes_every_check(tmp_path):
    path = write(tmp_path / "events", DAY, rows())
    out = by_name(validate_events(path, DAY, accounting=accounting(25, 20, 5)))
    assert list(out) == EVENTS_CHECKS.names()
    assert {k: o.summary() for k, o in out.items() if not o.passed} == {}
    assert out["events_keys_not_null"].evaluated >= 10


@pytest.mark.breaks("events:events_keys_not_null",
                    "events:events_impression_id_unique",
                    "events:events_position_in_range",
                    "events:events_ts_in_day",
                    "events:events_label_binary")
def test_each_blocking_check_catches_its_defect_with_observed_value_and_sample_rows(tmp_path):
    data = rows()
    data[3]["position"] = 0                      # position out of range
    data[4]["impression_id"] = "i5"              # duplicate impression_id
    data[6]["ts_ms"] = START - 1                 # before the day
    data[7]["label"] = 2                         # not binary
    data[8]["user_id"] = None                    # null key
    data[9]["device"] = None                     # null impression field
    path = write(tmp_path / "events", DAY, data)
    out = by_name(validate_events(path, DAY, accounting=accounting(25, 20, 5)))
    failing = {k for k, o in out.items() if not o.passed}
    assert failing == {"events_position_in_range", "events_impression_id_unique", "events_ts_in_day",
                       "events_label_binary", "events_keys_not_null"}
    pos = out["events_position_in_range"].failures[0]
    assert pos.expectation == "expect_column_values_to_be_between" and pos.unexpected_count == 1
    assert pos.sample_values == [0] and pos.sample_rows[0]["impression_id"] == "i3"
    result = to_check_result("events", EVENTS_CHECKS.get("events_position_in_range"), out["events_position_in_range"])
    assert isinstance(result, dg.AssetCheckResult) and not result.passed
    assert result.severity == dg.AssetCheckSeverity.ERROR
    assert result.metadata["failing_expectation"].value == "expect_column_values_to_be_between"
    assert result.metadata["sample_offending_rows"].value[0]["position"] == 0
    assert "1 of 20 rows unexpected" in result.description  # of the 20 feed impressions
    keys = out["events_keys_not_null"]
    assert {f.kwargs["column"] for f in keys.failures} == {"user_id", "device"}

    # the slots of the impression's surface bound its position: 4 is fine on feed, not on the 3-slot detail
    data = rows()
    data[2].update(surface="detail", position=4)
    out = by_name(validate_events(write(tmp_path / "slots", DAY, data), DAY, accounting=accounting(25, 20, 5)))
    assert not out["events_position_in_range"].passed and "max_value=3" in out["events_position_in_range"].summary()


@pytest.mark.breaks("events:events_schema")
def test_schema_check_catches_missing_column_and_wrong_type(tmp_path):
    types = dict(EVENT_COLUMNS, ts_ms="string")
    data = [dict(r, ts_ms=str(r["ts_ms"])) for r in rows()]
    path = write(tmp_path / "events", DAY, data, types)
    out = by_name(validate_events(path, DAY, accounting=accounting(25, 20, 5)))
    assert not out["events_schema"].passed
    assert "ts_ms" in out["events_schema"].summary()
    types2 = {c: t for c, t in EVENT_COLUMNS.items() if c != "device"}
    path2 = write(tmp_path / "events2", DAY, [{k: v for k, v in r.items() if k != "device"} for r in rows()], types2)
    out2 = by_name(validate_events(path2, DAY, accounting=accounting(25, 20, 5)))
    assert not out2["events_schema"].passed
    assert out2["events_schema"].failures[0].expectation == "expect_table_columns_to_match_set"


@pytest.mark.breaks("events:events_not_empty")
def test_empty_day_names_reason_and_count(tmp_path):
    path = write(tmp_path / "events", DAY, [])
    acc = {"impressions": {"input_lines": 40, "accepted": 0, "quarantined": 40, "duplicates": 0,
                           "quarantined_by_reason": {"malformed_json": 31, "bad_type": 9}}}
    out = by_name(validate_events(path, DAY, accounting=acc))
    ne = out["events_not_empty"]
    assert not ne.passed
    assert ne.summary() == (f"no events accepted for {DAY}: 0 of 40 input lines accepted; "
                            "40 quarantined (malformed_json=31, bad_type=9), 0 duplicates")
    result = to_check_result("events", EVENTS_CHECKS.get("events_not_empty"), ne)
    assert result.severity == dg.AssetCheckSeverity.ERROR and "malformed_json=31" in result.description
    assert out["events_row_accounting"].passed


@pytest.mark.breaks("events:events_row_accounting")
def test_row_accounting_that_does_not_close_is_blocking(tmp_path):
    path = write(tmp_path / "events", DAY, rows())
    acc = accounting(25, 20, 5)
    acc["impressions"]["input_lines"] += 3  # 3 lines unaccounted for
    out = by_name(validate_events(path, DAY, accounting=acc))
    assert not out["events_row_accounting"].passed
    assert "DOES NOT close" in out["events_row_accounting"].summary()
    out2 = by_name(validate_events(path, DAY, accounting=accounting(30, 25, 5)))  # claims 25 impressions, has 20
    assert not out2["events_row_accounting"].passed
    assert "holds 25 rows but the job accepted 30" in out2["events_row_accounting"].summary()


@pytest.mark.breaks("events:events_ctr_drift", "events:events_volume_drop")
def test_drift_warnings_ctr_volume_quarantine(tmp_path):
    base = tmp_path / "events"
    for k in range(1, 4):
        d = (dt.date.fromisoformat(DAY) - dt.timedelta(days=k)).isoformat()
        write(base, d, rows(n_imps=200, n_clicked=10, n_beh=100, day_start=START - k * 86_400_000))
    trailing = trailing_stats(base, DAY, 7)
    assert len(trailing.days) == 3 and trailing.rows == 300 and trailing.ctr == pytest.approx(0.05)

    # today: far fewer rows and a CTR of 50 %
    path = write(base, DAY, rows(n_imps=40, n_clicked=20, n_beh=10))
    out = by_name(validate_events(path, DAY, accounting=accounting(50, 40, 10)))
    for name in ("events_ctr_drift", "events_volume_drop"):
        assert not out[name].passed, name
        r = to_check_result("events", EVENTS_CHECKS.get(name), out[name])
        assert r.severity == dg.AssetCheckSeverity.WARN
    blocking_failed = [o.check for o in out.values() if not o.passed and EVENTS_CHECKS.get(o.check).blocking]
    assert blocking_failed == []
    assert "OUTSIDE" in out["events_ctr_drift"].summary()


@pytest.mark.breaks("events:events_quarantine_rate", "events:events_quarantine_warning")
def test_quarantine_shares_per_reason_and_per_file_warn_then_block(tmp_path):
    path = write(tmp_path / "events", DAY, rows(n_imps=20, n_beh=5))
    rates = QuarantineRates(per_reason=RateLimit(warn_above=0.02, block_above=0.10),
                            per_file=RateLimit(warn_above=0.03, block_above=0.15), min_lines=50)

    def judge(q: dict, files: dict | None = None):
        acc = accounting(25 + 1000, 20, 5, q)
        acc["impressions"]["duplicates"] = 1000 - sum(q.values())  # 1000 more impression lines, closing
        out = by_name(validate_events(path, DAY, accounting=acc, thresholds=EventsThresholds(quarantine=rates), files=files))
        return out["events_quarantine_rate"], out["events_quarantine_warning"]

    block, warn = judge({"missing_key": 10})                          # 1 % of 1020 lines: within both
    assert block.passed and warn.passed
    block, warn = judge({"missing_key": 10, "position_out_of_range": 40})  # 3.9 %: warning only
    assert block.passed and not warn.passed
    assert "impressions position_out_of_range: 40 of 1020 lines, 3.9% > 2.0%" in warn.summary()
    assert to_check_result("events", EVENTS_CHECKS.get("events_quarantine_warning"), warn).severity == dg.AssetCheckSeverity.WARN
    block, warn = judge({"unknown_enum": 306})                        # 30 %: blocks, naming reason and share
    assert not block.passed and "impressions unknown_enum: 306 of 1020 lines, 30.0% > 10.0%" in block.summary()
    r = to_check_result("events", EVENTS_CHECKS.get("events_quarantine_rate"), block)
    assert r.severity == dg.AssetCheckSeverity.ERROR and "30.0%" in r.description
    # one broken file among clean ones: the day's reason shares are low, the file's share is not
    files = {"date=x/impressions-00000.jsonl.gz": {"kind": "impressions", "lines": 900, "quarantined": 0},
             "date=x/impressions-00001.jsonl.gz": {"kind": "impressions", "lines": 120, "quarantined": 30}}
    block, warn = judge({"malformed_json": 30}, files)
    assert not block.passed and "file date=x/impressions-00001.jsonl.gz: 30 of 120 lines quarantined, 25.0% > 15.0%" in block.summary()
    # kinds and files below min_lines are reported, not judged
    small = by_name(validate_events(path, DAY, accounting=accounting(25, 19, 5, {"missing_key": 1}),
                                    thresholds=EventsThresholds(quarantine=rates)))
    assert small["events_quarantine_rate"].passed and small["events_quarantine_warning"].passed


def test_source_declared_empty_day_is_a_recorded_empty_partition(tmp_path):
    path = write(tmp_path / "events", DAY, [])
    acc = {k: {"input_lines": 0, "accepted": 0, "quarantined": 0, "duplicates": 0} for k in ("impressions", "behaviors")}
    out = by_name(validate_events(path, DAY, accounting=acc, declared_empty=True))
    assert {k: o.summary() for k, o in out.items() if not o.passed} == {}
    assert "declares the day empty" in out["events_not_empty"].summary()
    assert not by_name(validate_events(path, DAY, accounting=acc))["events_not_empty"].passed


def test_ctr_band_widens_for_small_days():
    th = EventsThresholds()
    assert ctr_band(0.05, 1_000_000, th) == pytest.approx((0.025, 0.075))  # relative band dominates
    lo, hi = ctr_band(0.05, 100, th)
    assert lo == 0.0 and hi > 0.13  # 4 binomial standard errors of a 100-impression day


def test_framework_groups_expectations_into_checks_and_specs():
    import great_expectations as gx
    import pandas as pd

    checks = DatasetChecks("toy", (CheckDef("toy_positive", "x > 0"), CheckDef("toy_small", "x small", blocking=False)))
    specs = {s.name: s for s in checks.specs("toy")}
    assert specs["toy_positive"].blocking and not specs["toy_small"].blocking
    df = pd.DataFrame({"x": [1, 2, -3, 400]})
    out = validate_frame(df, {
        "toy_positive": [gx.expectations.ExpectColumnValuesToBeBetween(column="x", min_value=1)],
        "toy_small": [gx.expectations.ExpectColumnMaxToBeBetween(column="x", max_value=100)],
    }, suite_name="toy")
    results = {r.check_name: r for r in to_check_results("toy", checks, out.values())}
    assert not results["toy_positive"].passed and results["toy_positive"].severity == dg.AssetCheckSeverity.ERROR
    assert results["toy_positive"].metadata["sample_offending_rows"].value == [{"x": -3}]
    assert not results["toy_small"].passed and results["toy_small"].severity == dg.AssetCheckSeverity.WARN
    assert results["toy_small"].metadata["observed_value"].value == "400"
    assert "observed 400" in results["toy_small"].description


def _set(index: int, **values):
    return lambda data: data[index].update(values)


# One defect each, for the expectations the test above does not reach: the check it fails, alone, and how.
SINGLE_DEFECTS = {
    "an unknown event kind": (_set(20, event_kind="click"), "events_keys_not_null", "expect_column_values_to_be_in_set", "event_kind"),
    "a behavior without its action": (_set(20, action=None), "events_keys_not_null", "expect_column_values_to_not_be_null", "action"),
    "an unknown surface": (_set(5, surface="banner"), "events_position_in_range", "expect_column_values_to_be_in_set", "surface"),
    "a click before its impression": (lambda data: data[0].update(click_ts_ms=data[0]["ts_ms"] - 1), "events_ts_in_day",
                                      "expect_column_pair_values_a_to_be_greater_than_b", None),
    "a click time without a click": (lambda data: data[5].update(click_ts_ms=data[5]["ts_ms"] + 50), "events_label_binary",
                                     "expect_column_values_to_be_null", "click_ts_ms"),
    "a click without its time": (_set(0, click_ts_ms=None), "events_label_binary", "expect_column_values_to_not_be_null", "click_ts_ms"),
    "a click type without a click": (_set(5, click_type="follow"), "events_label_binary", "expect_column_values_to_be_null", "click_type"),
}


@pytest.mark.breaks("events:events_keys_not_null",
                    "events:events_position_in_range",
                    "events:events_ts_in_day",
                    "events:events_label_binary")
@pytest.mark.parametrize("defect", sorted(SINGLE_DEFECTS))
def test_one_defect_fails_its_check_alone_with_the_expectation_it_breaks(tmp_path, defect):
    change, check, expectation, column = SINGLE_DEFECTS[defect]
    data = rows()
    change(data)
    out = by_name(validate_events(write(tmp_path / "events", DAY, data), DAY, accounting=accounting(25, 20, 5)))
    assert {k for k, o in out.items() if not o.passed} == {check}
    [failure] = out[check].failures
    assert failure.expectation == expectation and failure.unexpected_count == 1
    assert column is None or failure.kwargs["column"] == column


@pytest.mark.breaks("events:events_not_empty", "events:events_row_accounting")
def test_without_the_jobs_accounting_the_partition_cannot_pass(tmp_path):
    out = by_name(validate_events(write(tmp_path / "events", DAY, rows()), DAY))
    assert not out["events_row_accounting"].passed
    assert out["events_row_accounting"].summary() == "no row accounting was reported for this partition"
    for name in ("events_quarantine_rate", "events_quarantine_warning"):
        assert out[name].passed and "quarantine rates not evaluated" in out[name].summary()
    empty = by_name(validate_events(write(tmp_path / "empty", DAY, []), DAY))["events_not_empty"]
    assert not empty.passed and empty.summary() == f"no events in {tmp_path / 'empty' / f'date={DAY}'} (0 rows)"
