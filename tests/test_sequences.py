"""The dbt-duckdb stage through Dagster: incremental == full, idempotent reruns, backfills, bad input."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contracts import ITEM_STAT_COLUMNS, ITEM_STAT_LAG_DAYS, TRAINING_SAMPLES
from testkit.synthetic_samples import write_training_samples
from assets.sequences import dbt_resource, sequence_models, training_samples_checks
from quality.training_samples import validate_training_samples
from assets.resources import GenrankPaths
from tests.event_lake import day_range, write_lake
from transforms import sequences

pytestmark = pytest.mark.slow   # dbt builds of five days through Dagster, each test a few of them: heavy integration

DAYS = day_range("2026-01-01", 5)
TABLES = {
    "user_sequences": "user_id, seq_index",
    "training_samples": "sample_date, user_id, event_rank",
    "position_buckets": "as_of_date, surface, position",
    "position_ctr": "as_of_date, surface, position",
    "user_stats": "stat_date, user_id",
    "item_stats": "stat_date, ad_id, campaign_id",
    "item_windows": "as_of_date, level, key",
}


def _build(home: Path, start: str, end: str | None = None, **config) -> dg.ExecuteInProcessResult:
    tags = {}
    if end and end != start:
        tags = {"dagster/asset_partition_range_start": start, "dagster/asset_partition_range_end": end}
    return dg.materialize(
        [sequence_models, training_samples_checks],
        partition_key=None if tags else start,
        tags=tags,
        resources={"dbt": dbt_resource(), "paths": GenrankPaths(home=str(home))},
        run_config={"ops": {"sequence_models": {"config": config}}} if config else None,
        raise_on_error=False,
    )


def _snapshot(home: Path) -> dict[str, pd.DataFrame]:
    with duckdb.connect(str(home / "warehouse.duckdb"), read_only=True) as con:
        return {t: con.execute(f"select * from {t} order by {order}").df() for t, order in TABLES.items()}


def _assert_same(a: dict, b: dict) -> None:
    for t in TABLES:
        pd.testing.assert_frame_equal(a[t].reset_index(drop=True), b[t].reset_index(drop=True), check_dtype=False, obj=t)


@pytest.fixture(scope="module")
def incremental_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("incremental")
    write_lake(home, DAYS)
    for day in DAYS:
        assert _build(home, day).success
    return home


@pytest.fixture(scope="module")
def full_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("full")
    write_lake(home, DAYS)
    result = _build(home, DAYS[0], DAYS[-1])
    assert result.success
    return home, result


def test_incremental_days_equal_one_full_build(incremental_home, full_home):
    _assert_same(_snapshot(incremental_home), _snapshot(full_home[0]))
    for day in DAYS:
        a = pd.read_parquet(incremental_home / "lake" / "training_samples" / f"date={day}")
        b = pd.read_parquet(full_home[0] / "lake" / "training_samples" / f"date={day}")
        pd.testing.assert_frame_equal(a, b)


def test_sequences_are_strictly_ordered_and_continue_across_days(full_home):
    seqs = _snapshot(full_home[0])["user_sequences"]
    for _, g in seqs.groupby("user_id"):
        assert list(g["seq_index"]) == list(range(1, len(g) + 1))
        assert g["ts_ms"].is_monotonic_increasing
        assert g["added_date"].is_monotonic_increasing


def test_a_built_training_samples_partition_is_the_contracts_schema(full_home, tmp_path):
    """The dbt model and contracts.TRAINING_SAMPLES (which the models read and testkit.synthetic_samples writes) agree."""
    home = full_home[0]
    contract = [(name, pa.type_for_alias(kind)) for name, kind in TRAINING_SAMPLES.items()]
    for day in DAYS:
        schema = pq.read_schema(next((home / "lake" / "training_samples" / f"date={day}").glob("*.parquet")))
        assert [(f.name, f.type) for f in schema] == contract, day
    [synthetic] = write_training_samples(str(tmp_path))
    assert [(f.name, f.type) for f in pq.read_schema(synthetic)] == contract


def test_training_samples_hold_history_before_the_day_then_the_day(full_home):
    home = full_home[0]
    seqs = _snapshot(home)["user_sequences"]
    day = DAYS[3]
    samples = pd.read_parquet(home / "lake" / "training_samples" / f"date={day}")
    for user, s in samples.groupby("user_id", sort=False):
        expected = seqs[(seqs.user_id == user) & (pd.to_datetime(seqs.added_date) <= pd.Timestamp(day))]
        assert list(s["event_rank"]) == list(expected["seq_index"])
        targets = s[s["is_target"]]
        assert (targets["event_kind"] == "impression").all()
        assert targets["label"].notna().all() and targets["position_bucket"].between(0, 1).all()
        history = s[pd.to_datetime(s["event_date"]) < pd.Timestamp(day)]
        assert history.empty or history["ts_ms"].max() < targets["ts_ms"].min()


def _window_counts(events: pd.DataFrame, as_of: str, column: str) -> pd.Series:
    """An item-statistics column as of a day, counted from the event lake: every user's impressions of the key on
    the days of the column's window ending ITEM_STAT_LAG_DAYS before ``as_of``."""
    level, count, days = column.split("_")
    newest = dt.date.fromisoformat(as_of) - dt.timedelta(days=ITEM_STAT_LAG_DAYS)
    oldest = newest - dt.timedelta(days=int(days.removesuffix("d")) - 1)
    window = events[(events["day"] >= oldest.isoformat()) & (events["day"] <= newest.isoformat())
                    & (events["event_kind"] == "impression")]
    return window.groupby("item_id" if level == "ad" else "campaign_id")["label"].agg(
        "count" if count == "impressions" else "sum")


def test_a_targets_item_statistics_count_only_whole_days_before_the_serving_lag(full_home):
    """Recomputed from the event lake: a target of day D carries its ad's and campaign's impressions and clicks
    of the days up to D-2 only (never its own impression, nor anything within the serving delay: the newest
    counted event is a day older), zero for an id those days never showed; history rows carry none. The
    statistics the run of the last day exports for the next day's requests are counted the same way."""
    home = full_home[0]
    events = pd.concat(pd.read_parquet(home / "lake" / "events" / f"date={d}").assign(day=d) for d in DAYS)
    counted = 0
    for day in DAYS:
        samples = pd.read_parquet(home / "lake" / "training_samples" / f"date={day}")
        targets = samples[samples["is_target"]]
        for column in ITEM_STAT_COLUMNS:
            key = "item_id" if column.startswith("ad_") else "campaign_id"
            expected = targets[key].map(_window_counts(events, day, column)).fillna(0).astype("int64")
            assert targets[column].tolist() == expected.tolist(), (day, column)
            counted += int((expected > 0).sum())
        assert samples.loc[~samples["is_target"], list(ITEM_STAT_COLUMNS)].isna().all().all()
    assert counted  # the days after the lag counted something
    following = (dt.date.fromisoformat(DAYS[-1]) + dt.timedelta(days=1)).isoformat()
    served = pd.read_parquet(home / "lake" / "item_windows" / f"date={following}")
    for column in ITEM_STAT_COLUMNS:
        level, name = column.split("_", 1)
        rows = served[served["level"] == level].set_index("key")[name]
        expected = _window_counts(events, following, column)
        assert rows.reindex(expected.index).tolist() == expected.tolist(), column
        assert (rows.drop(expected.index) == 0).all(), column   # keys counted only in the longer window


def test_history_is_trimmed_to_max_len(tmp_path):
    write_lake(tmp_path, DAYS[:3], mean_events=30)
    result = _build(tmp_path, DAYS[0], DAYS[2], max_seq_len=7)
    assert result.success
    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as con:
        history = con.execute(f"""select user_id, count(*) filter (where event_date < sample_date) h,
                                         max(event_rank) filter (where event_date < sample_date) last_hist,
                                         min(event_rank) filter (where event_date < sample_date) first_hist
                                  from training_samples where sample_date = '{DAYS[2]}' group by user_id""").df()
    assert (history["h"] <= 7).all() and (history["h"] == 7).any()
    kept = history.dropna()
    assert ((kept["last_hist"] - kept["first_hist"] + 1) == kept["h"]).all()  # the newest 7, contiguous


def test_rerunning_a_day_is_idempotent(tmp_path, incremental_home):
    home = tmp_path / "home"
    shutil.copytree(incremental_home, home)
    before = _snapshot(home)
    assert _build(home, DAYS[-1]).success
    _assert_same(before, _snapshot(home))


def test_backfilling_a_middle_range_recomputes_later_days(tmp_path, full_home):
    """Rule: rebuilding day D invalidates state(D..); a middle-range backfill runs on to the last built day."""
    home = tmp_path / "home"
    shutil.copytree(full_home[0], home)
    # a bug fix changes day 2's events: one user's events on that day disappear
    part = home / "lake" / "events" / f"date={DAYS[1]}" / "part-00000.parquet"
    df = pd.read_parquet(part)
    df[df.user_id != "u3"].to_parquet(part, index=False)
    result = _build(home, DAYS[1], DAYS[2])
    assert result.success
    mats = [m for m in result.get_asset_materialization_events()
            if m.event_specific_data.materialization.asset_key == dg.AssetKey("training_samples")]
    assert mats[0].event_specific_data.materialization.metadata["window"].value == f"{DAYS[1]}..{DAYS[-1]}"
    expected_home = tmp_path / "scratch"
    expected_home.mkdir()
    shutil.copytree(home / "lake" / "events", expected_home / "lake" / "events")
    assert _build(expected_home, DAYS[0], DAYS[-1]).success
    _assert_same(_snapshot(home), _snapshot(expected_home))


def test_metadata_reports_lengths_and_buckets(full_home):
    home, result = full_home
    md = {m.event_specific_data.materialization.asset_key.to_user_string(): m.event_specific_data.materialization.metadata
          for m in result.get_asset_materialization_events()}
    samples = {day: pd.read_parquet(home / "lake" / "training_samples" / f"date={day}") for day in DAYS}
    reported = {k: md["training_samples"][k].value for k in ("samples", "targets", "history_len_mean", "history_len_max")}
    last = samples[DAYS[-1]]
    history = (pd.to_datetime(last["event_date"]) < pd.Timestamp(DAYS[-1])).groupby(last["user_id"]).sum()
    assert reported == pytest.approx({   # samples and targets over the run's days, history lengths of its last day
        "samples": sum(s["user_id"].nunique() for s in samples.values()),
        "targets": sum(int(s["is_target"].sum()) for s in samples.values()),
        "history_len_mean": history.mean(), "history_len_max": history.max()})
    assert md["training_samples"]["history_len_p50"].value == pytest.approx(history.quantile(0.5))
    assert "| surface | position |" in md["position_buckets"]["buckets"].value
    checks = result.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks)
    assert {c.asset_key.to_user_string() for c in checks} >= {"training_samples", "user_sequences", "position_buckets"}


def test_missing_upstream_partition_names_the_day(tmp_path):
    write_lake(tmp_path, [DAYS[0], DAYS[2]])
    with pytest.raises(sequences.SequenceInputError, match=f"events partition {DAYS[1]} is missing"):
        sequences.plan_window(tmp_path, DAYS[0], DAYS[2])
    result = _build(tmp_path, DAYS[0], DAYS[2])
    assert not result.success
    assert f"events partition {DAYS[1]} is missing" in result.get_step_failure_events()[0].event_specific_data.error.to_string()


def test_changed_schema_names_the_day_and_column(tmp_path):
    write_lake(tmp_path, DAYS[:2])
    part = tmp_path / "lake" / "events" / f"date={DAYS[1]}" / "part-00000.parquet"
    original = pq.read_table(part)
    table = original.set_column(original.schema.get_field_index("ts_ms"), "ts_ms",
                                pa.array([str(v) for v in original["ts_ms"].to_pylist()]))
    pq.write_table(table, part)
    with pytest.raises(sequences.SequenceInputError, match=f"events partition {DAYS[1]}: column 'ts_ms' has type string"):
        sequences.plan_window(tmp_path, DAYS[0], DAYS[1])
    pq.write_table(original.drop(["position"]), part)
    with pytest.raises(sequences.SequenceInputError, match=f"events partition {DAYS[1]}: column 'position' is missing"):
        sequences.plan_window(tmp_path, DAYS[0], DAYS[1])


def test_skipping_a_day_is_refused(tmp_path, incremental_home):
    home = tmp_path / "home"
    shutil.copytree(incremental_home, home)
    write_lake(home, day_range(DAYS[-1], 3)[1:])
    later = day_range(DAYS[-1], 3)[2]
    with pytest.raises(sequences.SequenceInputError, match=f"day {day_range(DAYS[-1], 2)[1]} must be built before {later}"):
        sequences.plan_window(home, later, later)


@pytest.mark.breaks("training_samples:samples_no_future_leakage",
                    "training_samples:samples_targets_labelled",
                    "training_samples:samples_bucket_range")
def test_gx_checks_catch_leakage_and_unlabelled_targets(tmp_path, full_home):
    day = DAYS[2]
    df = pd.read_parquet(full_home[0] / "lake" / "training_samples" / f"date={day}")
    assert all(o.passed for o in validate_training_samples(full_home[0] / "lake" / "training_samples" / f"date={day}",
                                                           day, 2).values())
    history = df.index[pd.to_datetime(df["event_date"]) < pd.Timestamp(day)]
    targets = df.index[df["is_target"]]
    df.loc[history[0], "ts_ms"] = int(pd.Timestamp(day, tz="UTC").timestamp() * 1000) + 5  # a "past" row from D
    df.loc[targets[0], "label"] = None
    df.loc[targets[1], "position_bucket"] = 7
    bad = tmp_path / "part-0.parquet"
    df.to_parquet(bad, index=False)
    outcomes = validate_training_samples(bad, day, 2)
    assert not outcomes["samples_no_future_leakage"].passed
    assert not outcomes["samples_targets_labelled"].passed
    assert not outcomes["samples_bucket_range"].passed
    assert "7" in str(outcomes["samples_bucket_range"].failures[0].sample_values)


def test_a_recorded_empty_day_is_built_empty_and_the_next_day_builds_on_the_day_before_it(tmp_path, incremental_home):
    home = tmp_path / "home"
    shutil.copytree(incremental_home, home)
    empty, after = day_range(DAYS[-1], 3)[1:]
    write_lake(home, [after])
    schema = pq.read_schema(home / "lake" / "events" / f"date={after}" / "part-00000.parquet")
    (home / "lake" / "events" / f"date={empty}").mkdir(parents=True)
    pq.write_table(schema.empty_table(), home / "lake" / "events" / f"date={empty}" / "part-00000.parquet")
    assert sequences.recorded_empty_day(home, empty) and not sequences.recorded_empty_day(home, after)

    before = _snapshot(home)["user_sequences"]
    assert sequences.plan_window(home, after, after).days == [after]  # the empty gap is no missing day
    assert _build(home, empty).success
    assert pq.read_table(home / "lake" / "training_samples" / f"date={empty}").num_rows == 0
    assert _build(home, after).success
    seqs = _snapshot(home)["user_sequences"]
    appended = seqs[seqs.added_date.astype(str) == after]
    heads = before.groupby("user_id").seq_index.max()
    first = appended.groupby("user_id").seq_index.min()
    continued = first[first.index.isin(heads.index)]
    assert len(continued) > 0 and (continued == heads[continued.index] + 1).all()


def test_the_samples_checks_use_the_runs_sequence_config():
    from assets.sequences import SequenceBuildConfig, run_sequence_config

    configured = {"ops": {"sequence_models": {"config": {"n_position_buckets": 3, "max_seq_len": 512}}}}
    assert run_sequence_config(configured).n_position_buckets == 3
    assert run_sequence_config({}) == SequenceBuildConfig()


@pytest.mark.breaks("training_samples:samples_targets_labelled", "training_samples:samples_no_future_leakage")
def test_gx_checks_catch_unknown_labels_missing_request_ids_and_rows_after_the_day(tmp_path, full_home):
    day = DAYS[2]
    df = pd.read_parquet(full_home[0] / "lake" / "training_samples" / f"date={day}")
    targets = df.index[df["is_target"]]
    df.loc[targets[0], "label"] = 2
    df.loc[targets[1], "request_id"] = None
    df.loc[targets[2], "ts_ms"] = int(pd.Timestamp(DAYS[3], tz="UTC").timestamp() * 1000)   # the next day's
    df.to_parquet(tmp_path / "part-0.parquet", index=False)
    outcomes = validate_training_samples(tmp_path / "part-0.parquet", day, 2)
    assert {n for n, o in outcomes.items() if not o.passed} == {"samples_targets_labelled", "samples_no_future_leakage"}
    labelled = {(f.expectation, f.kwargs["column"]) for f in outcomes["samples_targets_labelled"].failures}
    assert labelled == {("expect_column_values_to_be_in_set", "label"), ("expect_column_values_to_not_be_null", "request_id")}
    [late] = outcomes["samples_no_future_leakage"].failures
    assert late.kwargs.get("row_condition") is None and late.unexpected_count == 1


@pytest.mark.breaks("training_samples:samples_bucket_range")
def test_the_samples_checks_of_a_range_fail_naming_the_failing_day(tmp_path, full_home):
    """training_samples_checks judge every day of a backfill: one broken day fails the check, named."""
    home = tmp_path / "home"
    shutil.copytree(full_home[0], home)
    part = home / "lake" / "training_samples" / f"date={DAYS[2]}" / "part-0.parquet"
    df = pd.read_parquet(part)
    df.loc[df.index[df["is_target"]][0], "position_bucket"] = 5
    df.to_parquet(part, index=False)
    job = dg.define_asset_job("samples_checks", selection=dg.AssetSelection.checks(training_samples_checks))
    defs = dg.Definitions(assets=[sequence_models], asset_checks=[training_samples_checks], jobs=[job],
                          resources={"dbt": dbt_resource(), "paths": GenrankPaths(home=str(home))})
    result = defs.resolve_job_def("samples_checks").execute_in_process(raise_on_error=False, tags={
        "dagster/asset_partition_range_start": DAYS[0], "dagster/asset_partition_range_end": DAYS[-1]})
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["samples_targets_labelled"].passed and checks["samples_no_future_leakage"].passed
    bucket = checks["samples_bucket_range"]
    assert not bucket.passed and bucket.description.startswith(f"{DAYS[2]}: ")
    assert bucket.metadata["days"].value == DAYS and bucket.metadata["failed_days"].value == [DAYS[2]]


def test_the_dbt_resource_knows_the_executables_version_without_running_it():
    """EnvironmentDbt answers dagster-dbt's version question from the installed dbt-core; it must be what the
    executable says, and dagster-dbt must still ask there (else the override is dead and the 4 s are back)."""
    from dagster_dbt import DbtCliResource

    resource = dbt_resource()
    said = subprocess.run([resource.dbt_executable, "--version"], capture_output=True, text=True, check=True).stdout
    assert f"installed: {resource._cli_version}" in said
    assert "_cli_version" in vars(DbtCliResource)
