"""One configuration: the quality report (benchmarks/quality_suite) trains exactly the teacher and the student the
pipeline trains and serves (assets/training.py's run configuration defaults), not a copy of their sizes."""

from __future__ import annotations

import dataclasses

import pytest

from assets.training import StudentTrainingConfig, TeacherTrainingConfig
from benchmarks.quality_suite import protocol
from benchmarks.quality_suite.variants import Recipe

OPERATIONAL = {"seed", "log_every", "ckpt_every", "device"}   # what a benchmark run sets for itself


def _recipe_fields(train) -> dict:
    return {k: v for k, v in dataclasses.asdict(train).items() if k not in OPERATIONAL}


def test_the_report_trains_the_pipelines_models_with_the_pipelines_training_settings():
    recipe = Recipe.served()
    teacher, student = TeacherTrainingConfig(), StudentTrainingConfig()
    assert recipe.teacher == teacher.architecture() and recipe.student == student.architecture()
    for kind, pipeline in (("teacher", teacher), ("student", student)):
        assert _recipe_fields(recipe.train(kind, seed=3)) == _recipe_fields(pipeline.train_config())
        assert recipe.train(kind, seed=3).seed == 3


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_fit_model_hands_the_recipe_to_the_pipelines_training_entry_point(kind, monkeypatch):
    """What protocol.fit_model passes to models.train_teacher / train_student is the recipe, seeded."""
    import models

    seen = {}

    class Stop(Exception):
        pass

    def capture(samples, *args, **kwargs):
        seen["cfg"], seen["train"] = (args[0], args[1]) if kind == "teacher" else (args[1], args[2])
        raise Stop

    monkeypatch.setattr(models, "train_teacher" if kind == "teacher" else "train_student", capture)

    class World:
        def samples(self, days):
            return [f"/nowhere/date={d}" for d in days]

    recipe = Recipe.served()
    cfg = recipe.teacher if kind == "teacher" else recipe.student
    with pytest.raises(Stop):
        protocol.fit_model(kind, cfg, None, ["2026-01-01"], World(), recipe, seed=2)
    assert seen["cfg"] == cfg and seen["train"] == recipe.train(kind, seed=2)


def test_the_report_trains_what_serves_unless_a_flag_says_otherwise():
    """quality_report.py's rows train the served recipe; --no-step-cap lifts only the step cap, of both models, and
    the report's header says so."""
    from benchmarks.quality_report import parser, report_recipe

    served = report_recipe(parser().parse_args([]))
    assert served == Recipe.served() and "800 steps" in served.describe()
    uncapped = report_recipe(parser().parse_args(["--no-step-cap"]))
    assert uncapped.teacher_train.max_steps is None and uncapped.student_train.max_steps is None
    assert uncapped.replace_train(max_steps=served.student_train.max_steps) == served
    assert "no step cap" in uncapped.describe() and "800 steps" not in uncapped.describe()
