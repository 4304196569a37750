"""The training assets' run configuration: one definition of the pipeline's model sizes (models.config,
what preset("demo") builds), and variables read when a run starts, not when the module is imported."""

from __future__ import annotations

import dataclasses
import os

import pydantic
import pytest
import torch

from assets import training
from deploy.gates import GateConfig
from deploy.onnx_export import PARITY_TOLERANCE
from models import preset
from models.config import (DEMO_SIZES, DEMO_STUDENT_SIZES, DEMO_TEACHER_SIZES, ModelSizes, student_config,
                           teacher_config, train_config)


def test_the_run_configuration_defaults_to_the_demo_sizes_field_for_field():
    sizes = {f.name for f in dataclasses.fields(ModelSizes)}
    assert set(training.ModelSizeConfig.model_fields) == sizes | {"torch_threads"}
    assert training.ModelSizeConfig().sizes() == DEMO_SIZES
    assert training.TeacherTrainingConfig().sizes() == DEMO_TEACHER_SIZES
    assert training.StudentTrainingConfig().sizes() == DEMO_STUDENT_SIZES


def test_day_counts_of_a_window_are_at_least_one():
    # a window of 0 days would slice days[-0:], i.e. every day
    assert training.StudentTrainingConfig().calibration_days == 3 and training.TeacherTrainingConfig().window_days == 7
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        training.StudentTrainingConfig(calibration_days=0)
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        training.TeacherTrainingConfig(window_days=0)


def test_the_demo_preset_is_what_the_pipeline_trains_and_serves():
    teacher, student, train = preset("demo")
    assert teacher == teacher_config(training.TeacherTrainingConfig().sizes())
    assert student == student_config(training.StudentTrainingConfig().sizes())
    assert train == train_config(training.StudentTrainingConfig().sizes())
    assert (student.backbone.d_model, teacher.backbone.n_layers, student.backbone.n_layers, student.backbone.n_heads,
            student.max_len, teacher.max_len) == (64, 4, 2, 2, 1024, 4096)


def test_torch_threads_are_read_when_the_run_starts(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("GENRANK_TORCH_THREADS", "3")
        training.StudentTrainingConfig().train_config()
        assert torch.get_num_threads() == 3
        training.StudentTrainingConfig(torch_threads=2).train_config()
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("GENRANK_TORCH_THREADS", "0")
        training.StudentTrainingConfig().train_config()
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        monkeypatch.setenv("GENRANK_TORCH_THREADS", "-1")
        with pytest.raises(ValueError, match="GENRANK_TORCH_THREADS"):
            training.StudentTrainingConfig().train_config()
    finally:
        torch.set_num_threads(before)


def test_the_latency_budget_is_read_when_the_run_starts(monkeypatch):
    assert training.EvaluationConfig().gate_config() == GateConfig()
    monkeypatch.setenv("GENRANK_LATENCY_BUDGET_MS", "120")
    assert training.EvaluationConfig().gate_config().latency_budget_ms == 120.0
    assert training.EvaluationConfig(latency_budget_ms=7.5).gate_config().latency_budget_ms == 7.5


def test_one_parity_tolerance_for_the_gate_and_the_export():
    assert GateConfig().parity_tolerance == PARITY_TOLERANCE
    assert training.EvaluationConfig().gate_config().parity_tolerance == PARITY_TOLERANCE
