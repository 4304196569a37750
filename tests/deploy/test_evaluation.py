"""The challenger evaluation's library (deploy/evaluation.py) and the registration of a trained model
(Registry.register_trained): the decision, gates.json, the evaluation's MLflow run and model card."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from deploy import evaluation
from deploy import registry as reg
from deploy.gates import GateConfig, GateResult
from models import preset
from models.student import Student
from testkit.synthetic_samples import write_training_samples

PASSED = GateResult("auc", True, 0.7, 0.69, "challenger AUC 0.7000 >= champion v1 AUC 0.6920 - 0.002: yes")
FAILED = GateResult("latency", False, 80.0, 50.0, "p99 request scoring (onnxruntime) 80.0 ms not <= budget 50.0 ms")


def _pred(seed: int = 0, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 0.3, n)
    return pd.DataFrame({"user_id": rng.integers(0, 20, n), "position_bucket": rng.integers(0, 2, n),
                         "p": p, "label": (rng.uniform(size=n) < p).astype(np.int8)})


def test_the_decision_is_approved_only_when_every_gate_passed():
    assert evaluation.decide([PASSED], force=False) == ("approved", "all gates passed")
    assert evaluation.decide([PASSED], force=True) == ("approved", "all gates passed")
    assert evaluation.decide([PASSED, FAILED], force=False) == ("refused", FAILED.reason)
    assert evaluation.decide([PASSED, FAILED], force=True) == ("forced", FAILED.reason)


def test_gates_json_reads_back_what_was_written(tmp_path):
    path = tmp_path / "evaluations" / "date=2026-01-02" / "gates.json"
    nan_gate = GateResult("onnx_parity", False, math.nan, 1e-4, "nothing measured")
    evaluation.write_gates(path, "3", True, [PASSED, FAILED, nan_gate])
    version, forced, gates = evaluation.read_gates(path)
    assert (version, forced) == ("3", True)
    assert gates[:2] == [PASSED, FAILED] and math.isnan(gates[2].observed)
    assert [p.name for p in path.parent.iterdir()] == ["gates.json"]  # no staging file left


def test_gates_json_is_replaced_whole_or_not_at_all(tmp_path):
    """A write that fails half-way leaves the previous decision and no staging file."""
    path = tmp_path / "gates.json"
    evaluation.write_gates(path, "1", False, [PASSED])
    with pytest.raises(TypeError):
        evaluation.write_gates(path, "2", False, [GateResult("auc", True, object(), 0.0, "unserialisable")])
    assert evaluation.read_gates(path) == ("1", False, [PASSED])
    assert [p.name for p in tmp_path.iterdir()] == ["gates.json"]


def test_out_of_time_metrics_count_the_clicks_per_bucket():
    pred = _pred()
    metrics = evaluation.out_of_time_metrics(pred)
    for k in (0, 1):
        assert metrics[f"bucket{k}_clicks"] == int(pred.loc[pred["position_bucket"] == k, "label"].sum())
    assert 0.0 < metrics["auc"] < 1.0


def test_flat_metrics_keep_finite_numbers_only():
    assert evaluation.flat_metrics("x_", {"auc": 0.7, "n": 3, "gauc": float("nan"), "name": "v1",
                                         "ll": np.float32(0.2)}) == {"x_auc": 0.7, "x_n": 3.0, "x_ll": pytest.approx(0.2)}


def test_run_gates_judges_the_evaluation_against_its_reference_kind():
    metrics = {"auc": 0.70, "logloss": 0.20}
    scored = evaluation.Evaluation("2", "champion v2", "itself", metrics, metrics, _pred(), 5.0, 1e-6)
    gates = {g.name: g for g in evaluation.run_gates(scored, GateConfig())}
    assert gates["auc"].passed and "compares the model with itself" in gates["auc"].reason
    slow = evaluation.Evaluation("2", "baseline", "baseline", {**metrics, "auc": 0.71}, metrics, _pred(), 80.0, 1e-6)
    gates = {g.name: g for g in evaluation.run_gates(slow, GateConfig(latency_budget_ms=50.0))}
    assert gates["auc"].passed and not gates["latency"].passed


@pytest.fixture
def registry(tmp_path):
    return reg.Registry(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts")


@pytest.fixture
def trained(tmp_path):
    """A (never trained) demo-size student and a day of synthetic samples to register it with."""
    import torch

    torch.manual_seed(0)
    [samples] = write_training_samples(str(tmp_path / "samples"), n_users=4)
    return Student(preset("demo")[1]), tmp_path / "samples" / "date=2026-01-10", samples


def test_register_trained_logs_the_run_and_registers_the_version(registry, trained):
    model, folder, _ = trained
    registry.ensure_registered(reg.CTR, "test")
    history = [{"step": 1, "loss": 0.9}, {"step": 2, "grad_norm": 1.0}, {"step": 3, "loss": 0.7}]
    version = registry.register_trained(
        reg.CTR, model, history, folder, run_name="student-2026-01-10", run_tags={"partition": "2026-01-10"},
        checkpoint_metadata={"partition": "2026-01-10"}, tags={"partition": "2026-01-10"}, description="a card")
    mv = registry.client.get_model_version(reg.CTR, version)
    assert mv.tags["partition"] == "2026-01-10" and mv.description == "a card"
    run = registry.client.get_run(mv.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "student-2026-01-10"
    assert run.data.tags["partition"] == "2026-01-10"
    assert run.data.params["max_len"] == str(model.cfg.max_len) and "backbone" in run.data.params
    losses = registry.client.get_metric_history(mv.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in losses) == [(0, pytest.approx(0.9)), (2, pytest.approx(0.7))]
    checkpoint = registry.checkpoint(reg.CTR, version, folder.parent / "download")
    assert checkpoint.name == "student.safetensors"
    assert reg.input_example(folder)["user_id"].nunique() == 1


@pytest.mark.parametrize("rows_per_group", [2, 3, 100])
def test_the_registered_examples_are_whole_user_days_across_row_groups(tmp_path, rows_per_group):
    """input_example and scored_user_day read the partition a row group at a time; a user-day that straddles
    row groups comes back whole, exactly as the rows a whole read of the partition holds for that user."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    day = pd.DataFrame({"user_id": ["a"] * 4 + ["b"] * 5 + ["c"] * 2,
                        "ts_ms": np.arange(11, dtype=np.int64),
                        "is_target": [False] * 4 + [False, False, True, True, False] + [True, False]})
    folder = tmp_path / "date=2026-01-10"
    folder.mkdir()
    pq.write_table(pa.Table.from_pandas(day, preserve_index=False), folder / "part-0.parquet",
                   row_group_size=rows_per_group)
    whole = pd.read_parquet(folder)
    pd.testing.assert_frame_equal(reg.input_example(folder), whole[whole["user_id"] == "a"].reset_index(drop=True))
    pd.testing.assert_frame_equal(reg.scored_user_day(folder), whole[whole["user_id"] == "b"].reset_index(drop=True))


def test_record_tags_the_version_and_logs_the_evaluation_run(registry, trained):
    model, folder, _ = trained
    registry.ensure_registered(reg.CTR, "test")
    version = registry.register_trained(
        reg.CTR, model, [], folder, run_name="student", run_tags={}, checkpoint_metadata={},
        tags={"partition": "2026-01-09"}, description="pending")
    challenger = registry.client.get_model_version(reg.CTR, version)
    pred = _pred()
    metrics = evaluation.out_of_time_metrics(pred)
    scored = evaluation.Evaluation(version, "baseline", "baseline", metrics, evaluation.out_of_time_metrics(_pred(1)),
                                   pred, 80.0, 1e-6)
    gates = evaluation.run_gates(scored, GateConfig(latency_budget_ms=50.0))
    decision, reasons = evaluation.decide(gates, force=True)
    run_id = evaluation.record(registry, challenger, "2026-01-10", scored, gates, decision, reasons, "a test")
    tags = registry.client.get_model_version(reg.CTR, version).tags
    assert tags["gate_decision"] == "forced" and "budget 50.0 ms" in tags["gate_reasons"]
    assert tags["evaluated_on"] == "2026-01-10" and tags["compared_with"] == "baseline"
    assert float(tags["oot_auc"]) == pytest.approx(metrics["auc"], abs=1e-6) and tags["latency_p99_ms"] == "80.00"
    run = registry.client.get_run(run_id)
    assert run.data.tags["decision"] == "forced" and run.data.tags["challenger_version"] == str(version)
    assert run.data.metrics["challenger_auc"] == pytest.approx(metrics["auc"])
    assert "reference_auc" in run.data.metrics and run.info.status == "FINISHED"
    artifacts = {a.path for a in registry.client.list_artifacts(run_id)}
    assert {"gates.txt", "metrics_by_bucket.json", "calibration_by_bucket.png"} <= artifacts
    card = registry.client.get_model_version(reg.CTR, version).description
    assert "a test" in card and run_id in card
