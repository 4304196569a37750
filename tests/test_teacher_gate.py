"""The teacher gate: a teacher's cached probabilities are the student's KD targets only when the teacher beats
what served the day (the champion, or before the first one the per-bucket CTR baseline) on the day's held-out
slice. A refused teacher is a decision (a WARN check; the student trains on labels alone and its version says
why); a partition without a readable gate blocks the student (ERROR); a refused teacher's logits are never read."""

from __future__ import annotations

import json
from types import SimpleNamespace

import dagster as dg
import pytest

from deploy import registry as reg
from deploy.gates import teacher_gate
from assets import training
from assets.resources import GenrankPaths, MlflowResource
from tests.conftest import copy_home


def test_the_teacher_must_beat_the_reference_outright():
    admitted = teacher_gate(0.81, 0.80, "teacher v2", "champion v3")
    assert admitted.passed and admitted.reason == ("teacher v2 AUC 0.8100 > champion v3 AUC 0.8000 on the day's "
                                                   "held-out slice: yes")
    assert not teacher_gate(0.80, 0.80, "teacher v2", "champion v3").passed
    refused = teacher_gate(0.70, 0.86, "teacher v1", "baseline")
    assert not refused.passed and refused.reason.endswith(": no")
    assert not teacher_gate(float("nan"), 0.5, "teacher v1", "baseline").passed   # one class: nothing shown
    assert not teacher_gate(0.9, float("nan"), "teacher v1", "baseline").passed


class _Aliases:
    def __init__(self, **versions):
        self.versions = versions

    def by_alias(self, name, alias):
        assert name == reg.CTR
        return self.versions.get(alias)


def test_what_served_a_day_is_the_champion_before_that_days_own_promotion():
    old = SimpleNamespace(version="2", tags={"evaluated_on": "2026-01-04"})
    new = SimpleNamespace(version="3", tags={"evaluated_on": "2026-01-05"})
    assert training._champion_serving(_Aliases(champion=new, previous=old), "2026-01-05") is old
    assert training._champion_serving(_Aliases(champion=new, previous=old), "2026-01-06") is new
    assert training._champion_serving(_Aliases(champion=new), "2026-01-05") is None
    assert training._champion_serving(_Aliases(), "2026-01-05") is None


@pytest.fixture
def home_with_gate(tiny_pipeline, tmp_path):
    source, report, _ = tiny_pipeline
    return copy_home(source, tmp_path / "home"), report.days[2]          # the first day with cached logits


def _resources(home) -> dict:
    return {"paths": GenrankPaths(home=str(home)), "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")}


def _gate_check(home, day) -> dg.AssetCheckEvaluation:
    job = dg.define_asset_job("teacher_logits_checks", selection=dg.AssetSelection.checks_for_assets(training.teacher_logits))
    defs = dg.Definitions(assets=[training.teacher_logits], asset_checks=[training.teacher_logits_checks], jobs=[job],
                          resources=_resources(home))
    result = defs.resolve_job_def("teacher_logits_checks").execute_in_process(
        tags={"dagster/partition": day}, raise_on_error=False)
    return {e.check_name: e for e in result.get_asset_check_evaluations()}["kd_gate"]


def _write_gate(home, day, passed: bool) -> None:
    gate = teacher_gate(0.9 if passed else 0.6, 0.7, "teacher v1", "baseline")
    training._kd_gate_path(GenrankPaths(home=str(home)), day).write_text(json.dumps(gate.__dict__))


@pytest.mark.slow
def test_the_pipeline_records_a_gate_with_every_cached_partition(tiny_pipeline):
    home, report, stdout = tiny_pipeline
    r = reg.default_registry(home)
    for day in report.days[2:]:
        gate = training.read_kd_gate(GenrankPaths(home=str(home)), day)
        assert gate.name == "teacher" and gate.reason.startswith("teacher v")
        student = r.find(reg.CTR, partition=day)
        if student is not None:
            assert student.tags["kd"] == ("on: " if gate.passed else "off: ") + gate.reason
            assert (student.tags["teacher_version"] == "none") != gate.passed


@pytest.mark.slow
@pytest.mark.breaks("teacher_logits:kd_gate")
def test_the_gate_check_warns_on_a_refusal_and_blocks_without_a_gate(home_with_gate):
    home, day = home_with_gate
    _write_gate(home, day, passed=True)
    admitted = _gate_check(home, day)
    assert admitted.passed
    _write_gate(home, day, passed=False)
    refused = _gate_check(home, day)
    assert not refused.passed and refused.severity == dg.AssetCheckSeverity.WARN
    assert refused.description.endswith("on the day's held-out slice: no: the student of the day trains on labels alone")
    training._kd_gate_path(GenrankPaths(home=str(home)), day).unlink()
    missing = _gate_check(home, day)
    assert not missing.passed and missing.severity == dg.AssetCheckSeverity.ERROR
    assert missing.description.startswith(f"no readable teacher gate for {day}: FileNotFoundError")


@pytest.mark.slow
def test_a_refused_teachers_logits_are_never_read_by_the_student(home_with_gate):
    """The refused partition's Parquet is replaced by bytes no reader accepts: the student still trains, on
    labels alone, and says so; admitted, the same bytes fail it (so the student does read admitted logits)."""
    home, day = home_with_gate
    (home / "lake" / "teacher_logits" / f"date={day}" / "part-0.parquet").write_bytes(b"not parquet")

    def student(passed: bool):
        _write_gate(home, day, passed)
        return dg.materialize([training.student_candidate], partition_key=day, resources=_resources(home),
                              run_config={"ops": {"student_candidate": {"config": {"force": True}}}},
                              raise_on_error=False)

    admitted = student(passed=True)
    assert not admitted.success
    refused = student(passed=False)
    assert refused.success
    version = refused.asset_materializations_for_node("student_candidate")[0].metadata["version"].value
    tags = reg.default_registry(home).client.get_model_version(reg.CTR, str(version)).tags
    assert tags["teacher_version"] == "none"
    assert tags["kd"] == "off: teacher v1 AUC 0.6000 > baseline AUC 0.7000 on the day's held-out slice: no"
