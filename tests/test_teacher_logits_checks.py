"""The teacher_logits checks fail on the defects they exist for: a target without a cached probability, a
non-finite one, a partition from another teacher version, no current teacher, and cached probabilities the
registered teacher does not reproduce."""

from __future__ import annotations


import dagster as dg
import pandas as pd
import pytest

from assets import training
from assets.resources import GenrankPaths, MlflowResource
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


@pytest.fixture
def home_with_logits(tiny_pipeline, tmp_path):
    source, report, _ = tiny_pipeline
    home = copy_home(source, tmp_path / "home")
    return home, report.days[2]          # the first day with cached logits


def _checks(home, day) -> dict[str, dg.AssetCheckEvaluation]:
    """The checks alone, in a run of the day's partition, as the daily run executes them after the asset."""
    job = dg.define_asset_job("teacher_logits_checks", selection=dg.AssetSelection.checks_for_assets(training.teacher_logits))
    defs = dg.Definitions(assets=[training.teacher_logits], asset_checks=[training.teacher_logits_checks], jobs=[job],
                          resources={"paths": GenrankPaths(home=str(home)),
                                     "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")})
    result = defs.resolve_job_def("teacher_logits_checks").execute_in_process(
        tags={"dagster/partition": day}, raise_on_error=False)   # the checks read their day from the run's tags
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def _tamper(home, day, change) -> None:
    path = home / "lake" / "teacher_logits" / f"date={day}" / "part-0.parquet"
    frame = pd.read_parquet(path)
    change(frame)
    frame.to_parquet(path, index=False)


def test_the_checks_pass_on_what_the_pipeline_cached(home_with_logits):
    checks = _checks(*home_with_logits)
    assert {n: c.passed for n, c in checks.items() if n != "kd_gate"} == {   # kd_gate: tests/test_teacher_gate.py
        "coverage": True, "finite": True, "one_teacher_version": True, "reproduced_by_teacher": True}
    assert checks["reproduced_by_teacher"].metadata["rescored_targets"].value > 0


def test_the_teacher_version_is_cached_as_a_string(home_with_logits):
    """The partition's bytes are part of the student's data_fingerprint: an int from the SQLite store and a
    string from a tracking server would give the same day two fingerprints (issue 15's stack comparison)."""
    home, day = home_with_logits
    cached = pd.read_parquet(home / "lake" / "teacher_logits" / f"date={day}" / "part-0.parquet")
    assert cached["teacher_version"].map(type).eq(str).all()


@pytest.mark.breaks("teacher_logits:one_teacher_version")
def test_a_partition_of_another_teacher_version_is_refused(home_with_logits):
    home, day = home_with_logits
    _tamper(home, day, lambda f: f.__setitem__("teacher_version", "7"))
    assert not _checks(home, day)["one_teacher_version"].passed


@pytest.mark.breaks("teacher_logits:reproduced_by_teacher")
def test_probabilities_the_teacher_does_not_reproduce_are_refused(home_with_logits):
    home, day = home_with_logits
    _tamper(home, day, lambda f: f.__setitem__("p", f["p"] * 0.99))
    checks = _checks(home, day)
    assert checks["one_teacher_version"].passed and not checks["reproduced_by_teacher"].passed


@pytest.mark.breaks("teacher_logits:coverage")
def test_a_target_without_cached_logits_fails_coverage(home_with_logits):
    home, day = home_with_logits
    dropped = []

    def drop_the_first_row(frame):
        dropped.append(frame["impression_id"].iloc[0])
        frame.drop(index=0, inplace=True)

    _tamper(home, day, drop_the_first_row)
    coverage = _checks(home, day)["coverage"]
    assert not coverage.passed
    assert coverage.metadata["missing"].value == 1 and coverage.metadata["sample_missing"].value == dropped


@pytest.mark.breaks("teacher_logits:finite")
def test_a_non_finite_probability_fails_finite_and_only_it(home_with_logits):
    home, day = home_with_logits
    _tamper(home, day, lambda f: f.loc.__setitem__((0, "p"), float("nan")))
    checks = _checks(home, day)
    assert not checks["finite"].passed
    assert checks["coverage"].passed and checks["one_teacher_version"].passed


@pytest.mark.breaks("teacher_logits:one_teacher_version", "teacher_logits:reproduced_by_teacher")
def test_without_a_current_teacher_the_day_gets_no_logits_and_a_cache_is_refused(home_with_logits):
    home, day = home_with_logits
    from deploy import registry as reg

    reg.default_registry(home).client.delete_registered_model_alias(reg.TEACHER, "current")
    checks = _checks(home, day)
    assert not checks["one_teacher_version"].passed
    assert checks["one_teacher_version"].metadata["registry_current"].value == "none"
    assert not checks["reproduced_by_teacher"].passed
    assert checks["reproduced_by_teacher"].description == "no genrank-teacher@current to reproduce the cache with"
    # the asset itself skips the day: no materialisation, the cached partition stays as it was
    before = (home / "lake" / "teacher_logits" / f"date={day}" / "part-0.parquet").read_bytes()
    result = dg.materialize([training.teacher_logits], partition_key=day, resources={
        "paths": GenrankPaths(home=str(home)), "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")})
    assert result.success and result.get_asset_materialization_events() == []
    assert (home / "lake" / "teacher_logits" / f"date={day}" / "part-0.parquet").read_bytes() == before
