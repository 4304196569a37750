"""End to end on the tiny world: `genrank run` materialises the whole graph for every day, a champion
is promoted, a deliberately broken challenger is refused by the gates, and rollback restores."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import dagster as dg
import pytest
import torch

from assets import training
from deploy import registry as reg
from assets.resources import GenrankPaths, MlflowResource
from testkit.faults import shuffle_training_labels
from tests.conftest import copy_home

pytestmark = pytest.mark.slow

DAILY_ASSETS = ("events", "position_ctr", "position_buckets", "user_sequences", "training_samples",
                "item_stats", "item_windows", "user_stats")


@pytest.fixture
def pipeline_run(tiny_pipeline, tmp_path):
    """The session's run on a copy of its home: these tests register versions and move aliases, and the
    session's home is what later tests (tests/stack) compare with."""
    source, report, stdout = tiny_pipeline
    return copy_home(source, tmp_path / "home"), report, stdout


def _resources(home):
    return {"paths": GenrankPaths(home=str(home)),
            "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")}


def test_every_day_materialises_with_all_checks_passing(pipeline_run):
    home, report, stdout = pipeline_run
    day_lines = [line for line in stdout.splitlines() if line[:10] in report.days and "  teacher " not in line]
    assert [line[:10] for line in day_lines] == report.days
    assert all(line[12:14] == "ok" for line in day_lines), day_lines
    assert "failed checks" not in stdout
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    for asset in DAILY_ASSETS:
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == set(report.days), asset
    # the teacher arrives after day 2, so days 3.. have cached logits and candidates; day 4 promotes
    assert instance.get_materialized_partitions(dg.AssetKey("teacher_logits")) == set(report.days[2:])
    assert instance.get_materialized_partitions(dg.AssetKey("student_candidate")) == set(report.days[2:])
    assert instance.get_materialized_partitions(dg.AssetKey("promotion")) == {report.days[3]}
    assert instance.get_materialized_partitions(dg.AssetKey("onnx_model")) == {report.days[3]}
    assert instance.get_latest_materialization_event(dg.AssetKey("teacher_model")) is not None
    # where the time went: every day's stages with their times, the memory of the run's process tree
    assert re.search(r"^Time by stage: .+ s .*peak RSS \d+\.\d GiB", stdout, re.M), stdout[-2000:]
    [run_report] = (home / "reports").glob("run-*.md")
    text = run_report.read_text()
    for step in ("events", "sequence_models", "teacher_model", "student_candidate"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {step} | "))   # the time table's
        assert row.count(" | ") == len(report.days) + 1, row
    assert "## Where the time goes" in text and "Peak resident memory (MiB)" in text


def test_a_champion_exists_with_its_evidence(pipeline_run):
    home, report, stdout = pipeline_run
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")
    assert champion is not None and champion.tags["partition"] == report.days[2]
    assert champion.tags["gate_decision"] == "approved"
    assert champion.tags["compared_with"] == "baseline"
    # calibrated on the held-out slices of its day and the two before (StudentTrainingConfig.calibration_days)
    assert champion.tags["calibration_window"] == f"{report.days[0]}..{report.days[2]}"
    for tag in ("teacher_version", "code_version", "data_window", "oot_auc", "oot_logloss", "latency_p99_ms",
                "onnx_max_abs_diff"):
        assert tag in champion.tags
    assert float(champion.tags["onnx_max_abs_diff"]) <= 1e-4
    bundle = json.loads((home / "serving" / "champion" / "champion.json").read_text())
    assert bundle["version"] == champion.version and (home / "serving" / "champion" / "model.onnx").is_file()
    assert "Champion: genrank-ctr v" in stdout
    assert r.by_alias(reg.TEACHER, "current") is not None
    evaluation = r.client.search_runs([r.experiment_id(reg.CTR)], f"tags.partition = '{report.days[3]}' and "
                                      f"tags.challenger_version = '{champion.version}'")[0]
    artifacts = {a.path for a in r.client.list_artifacts(evaluation.info.run_id)}
    assert {"calibration_by_bucket.png", "metrics_by_bucket.json", "gates.txt"} <= artifacts


@pytest.mark.breaks("challenger_evaluation:gate_auc")
def test_broken_challenger_is_refused_then_forced_then_rolled_back(pipeline_run, capsys):
    home, report, _ = pipeline_run
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")
    day3, day4 = report.days[2], report.days[3]
    shuffle_training_labels(home, day3)   # day 3's candidate retrained on labels that say nothing
    broken = dg.materialize([training.student_candidate], partition_key=day3, resources=_resources(home))
    broken_version = broken.get_asset_materialization_events()[0].event_specific_data.materialization.metadata["version"].value
    assert broken_version != champion.version

    # A refusal is a decision: the run succeeds, the gates that refused are WARN checks, and promotion records
    # the refusal with its reasons and keeps the champion; `genrank status` shows it on the day, exit code 0.
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    gated = dg.materialize([training.challenger_evaluation, training.promotion, training.promotion_gates],
                           partition_key=day4, resources=_resources(home), instance=instance)
    failed = {e.check_name: e.severity for e in gated.get_asset_check_evaluations() if not e.passed}
    assert "gate_auc" in failed and set(failed.values()) == {dg.AssetCheckSeverity.WARN}
    [promoted] = [e.event_specific_data.materialization for e in gated.get_asset_materialization_events()
                  if e.asset_key == dg.AssetKey("promotion")]
    assert {k: promoted.metadata[k].value for k in ("decision", "promoted", "champion_version", "challenger_version")} \
        == {"decision": "refused", "promoted": False, "champion_version": champion.version,
            "challenger_version": broken_version}
    assert "AUC" in promoted.metadata["reasons"].value
    assert r.by_alias(reg.CTR, "champion").version == champion.version
    refused = r.client.get_model_version(reg.CTR, broken_version)
    assert refused.tags["gate_decision"] == "refused" and "AUC" in refused.tags["gate_reasons"]
    from pipelines.cli import main

    assert main(["status", "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert f"  {day4}  processed            challenger v{broken_version} refused: " in out and "AUC" in out
    gates = json.loads((home / "lake" / "evaluations" / f"date={day4}" / "gates.json").read_text())
    assert gates["challenger_version"] == broken_version

    forced = dg.materialize([training.challenger_evaluation, training.promotion, training.promotion_gates],
                            partition_key=day4, resources=_resources(home),
                            run_config={"ops": {"challenger_evaluation": {"config": {"force": True}}}})
    assert forced.success
    assert r.by_alias(reg.CTR, "champion").version == broken_version
    assert r.client.get_model_version(reg.CTR, broken_version).tags["gate_decision"] == "forced"
    assert r.by_alias(reg.CTR, "previous").version == champion.version

    assert main(["rollback", "--home", str(home)]) == 0
    assert r.by_alias(reg.CTR, "champion").version == champion.version
    assert r.by_alias(reg.CTR, "previous") is None
    with pytest.raises(ValueError, match="nothing to roll back to"):
        r.rollback(reg.CTR)


def test_rerunning_a_day_reuses_its_registered_candidate(pipeline_run):
    home, report, _ = pipeline_run
    r = reg.default_registry(home)
    before = len(r.client.search_model_versions(f"name = '{reg.CTR}'"))
    again = dg.materialize([training.student_candidate], partition_key=report.days[3], resources=_resources(home))
    meta = again.get_asset_materialization_events()[0].event_specific_data.materialization.metadata
    assert meta["reused"].value is True
    assert len(r.client.search_model_versions(f"name = '{reg.CTR}'")) == before


# The training process dies the moment its first checkpoint is in place: os._exit skips every cleanup, as
# SIGKILL does, at a step the test knows instead of wherever a race with a kill lands.
DIE_AFTER_FIRST_CHECKPOINT = """
import contextlib, os
from models import train

staged_file = train.staged_file


@contextlib.contextmanager
def dying_after_the_checkpoint(path):
    with staged_file(path) as staging:
        yield staging
    if path.name == "latest.pt":
        os._exit(137)


train.staged_file = dying_after_the_checkpoint
"""


def test_a_killed_training_run_resumes_from_its_checkpoint_and_leaves_nothing_behind(pipeline_run, caplog):
    home, report, _ = pipeline_run
    r = reg.default_registry(home)
    day = report.days[3]
    before = len(r.client.search_model_versions(f"name = '{reg.CTR}'"))
    config = {"force": True, "epochs": 400, "warm_epochs": 400, "patience": 400, "max_steps": 40, "ckpt_every": 20}
    script = DIE_AFTER_FIRST_CHECKPOINT + (
        "import dagster as dg\n"
        "from assets import training\n"
        "from assets.resources import GenrankPaths, MlflowResource\n"
        f"dg.materialize([training.student_candidate], partition_key={day!r}, resources={{"
        f"'paths': GenrankPaths(home={str(home)!r}), 'mlflow': MlflowResource(tracking_uri={'sqlite:///' + str(home / 'mlflow.db')!r})}},"
        f" run_config={{'ops': {{'student_candidate': {{'config': {config!r}}}}}}})\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], cwd=str(home), env={**os.environ, "GENRANK_HOME": str(home)},
                            capture_output=True, text=True, timeout=900)
    assert killed.returncode == 137, killed.stderr[-3000:]
    [checkpoint] = (home / "checkpoints").glob("student-*/latest.pt")
    step = torch.load(checkpoint, weights_only=True)["step"]   # the end of the first pass over the day, or step 20
    assert 0 < step < config["max_steps"]
    assert len(r.client.search_model_versions(f"name = '{reg.CTR}'")) == before  # nothing half-registered

    with caplog.at_level(logging.INFO, logger="genrank.models"):
        resumed = dg.materialize([training.student_candidate], partition_key=day, resources=_resources(home),
                                 run_config={"ops": {"student_candidate": {"config": config}}})
    assert resumed.success
    assert f"resumed from {checkpoint} at step {step} " in caplog.text
    meta = resumed.get_asset_materialization_events()[0].event_specific_data.materialization.metadata
    assert r.client.get_model_version(reg.CTR, meta["version"].value).tags["partition"] == day
    assert len(r.client.search_model_versions(f"name = '{reg.CTR}'")) == before + 1
    assert not list((home / "checkpoints").glob("student-*"))
    assert not [p for p in (home / "lake").rglob(".tmp-*")]
    versions = [r.client.get_model_version(reg.CTR, v.version) for v in r.client.search_model_versions(f"name = '{reg.CTR}'")]
    assert [v.version for v in versions if "champion" in v.aliases] == [r.by_alias(reg.CTR, "champion").version]


def test_a_changed_student_config_starts_cold_instead_of_loading_mismatched_weights(pipeline_run):
    """A release that changes the student (here its depth) cannot warm-start from older candidates: the day
    trains from scratch and says so, where loading the old weights would fail or silently mix models."""
    home, report, _ = pipeline_run
    day = report.days[-1]
    changed = dg.materialize([training.student_candidate], partition_key=day, resources=_resources(home),
                             run_config={"ops": {"student_candidate": {"config": {"force": True, "student_layers": 1}}}})
    meta = changed.get_asset_materialization_events()[0].event_specific_data.materialization.metadata
    assert meta["warm_start_from"].value == "none"
    r = reg.default_registry(home)
    assert r.client.get_model_version(reg.CTR, meta["version"].value).tags["warm_start_from"] == "none"
