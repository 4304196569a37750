"""A day the source declares empty reaches the model stages as a recorded empty training_samples partition
(tests/test_sequences.py pins that the sequence stage builds it so). Its daily run succeeds and skips what
needs the day's impressions: no cached logits, no candidate, no evaluation, no promotion. The next day's
candidate warm-starts from the newest candidate before the gap."""

from __future__ import annotations

import datetime as dt
import shutil

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets import training
from deploy import registry as reg
from assets.resources import GenrankPaths, MlflowResource
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


def _run_model_stages(home, day: str) -> dg.ExecuteInProcessResult:
    """The models group of daily_job for one day, in process, as the daily run executes it after the sequences."""
    job = dg.define_asset_job("model_stages", selection=dg.AssetSelection.groups(training.GROUP),
                              executor_def=dg.in_process_executor)
    defs = dg.Definitions(assets=dg.load_assets_from_modules([training]),
                          asset_checks=dg.load_asset_checks_from_modules([training]), jobs=[job],
                          resources={"paths": GenrankPaths(home=str(home)),
                                     "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")})
    return defs.resolve_job_def("model_stages").execute_in_process(partition_key=day, raise_on_error=False)


def _after(day: str, n: int) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=n)).isoformat()


def _candidates(home) -> dict[str, str]:
    """Partition -> version of every genrank-ctr candidate."""
    versions = reg.default_registry(home).client.search_model_versions(f"name='{reg.CTR}'")
    return {v.tags["partition"]: str(v.version) for v in versions}


def test_a_declared_empty_day_skips_the_model_stages_and_the_next_day_builds_on_the_day_before(tiny_pipeline, tmp_path,
                                                                                                monkeypatch):
    source, report, _ = tiny_pipeline
    home = copy_home(source, tmp_path / "home")
    monkeypatch.setenv("GENRANK_LATENCY_BUDGET_MS", "1e9")   # as tiny_pipeline: wall-clock time must not decide
    last = report.days[-1]
    empty, after = _after(last, 1), _after(last, 2)
    samples = home / "lake" / "training_samples"
    (samples / f"date={empty}").mkdir()
    for part in (samples / f"date={last}").glob("*.parquet"):
        pq.write_table(pq.read_schema(part).empty_table(), samples / f"date={empty}" / part.name)
    shutil.copytree(samples / f"date={last}", samples / f"date={after}")   # the models only need a day of rows
    before = _candidates(home)
    champion = reg.default_registry(home).by_alias(reg.CTR, "champion")

    result = _run_model_stages(home, empty)
    assert result.success
    for asset in ("teacher_logits", "student_candidate", "challenger_evaluation", "promotion", "onnx_model"):
        assert not result.asset_materializations_for_node(asset), asset
    assert _candidates(home) == before
    assert not (home / "lake" / "teacher_logits" / f"date={empty}").exists()
    assert str(reg.default_registry(home).by_alias(reg.CTR, "champion").version) == str(champion.version)

    result = _run_model_stages(home, after)
    assert result.success
    candidates = _candidates(home)
    assert set(candidates) == {*before, after}
    newest = reg.default_registry(home).find(reg.CTR, partition=after)
    assert newest.tags["warm_start_from"] == before[last]
    assert not result.asset_materializations_for_node("challenger_evaluation")   # no candidate of the empty day
