"""The model stages' own refusals, which a daily run never meets (challenger_evaluation judges the challenger
before promotion, and the candidate's parity gate measures its graph): promotion refuses a challenger that no
evaluation judged on the day, or whose recorded decision is none it knows, and onnx_model refuses a champion
whose registered graph is not its checkpoint. Each on a copy of the session's tiny run."""

from __future__ import annotations

import datetime as dt
import shutil

import dagster as dg
import pytest

from deploy import registry as reg
from assets import training
from assets.resources import GenrankPaths, MlflowResource
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tiny_pipeline, tmp_path):
    source, report, _ = tiny_pipeline
    return copy_home(source, tmp_path / "home"), report


def _materialize(asset, home, day) -> dg.ExecuteInProcessResult:
    return dg.materialize([asset], partition_key=day, raise_on_error=False, resources={
        "paths": GenrankPaths(home=str(home)), "mlflow": MlflowResource(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")})


def _error(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    return result.get_step_failure_events()[0].event_specific_data.error.to_string()


@pytest.mark.breaks("promotion:refusal")
def test_promotion_refuses_a_challenger_with_an_unknown_decision_and_one_never_evaluated(home):
    home, report = home
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")      # day 3's candidate, approved on day 4
    promoted_on = champion.tags["evaluated_on"]
    r.client.set_model_version_tag(reg.CTR, champion.version, "gate_decision", "pending")
    error = _error(_materialize(training.promotion, home, promoted_on))
    assert f"genrank-ctr v{champion.version} has the gate decision 'pending' on {promoted_on}, none of " in error
    # the last day's candidate has no next day to be evaluated on
    after_last = (dt.date.fromisoformat(report.days[-1]) + dt.timedelta(days=1)).isoformat()
    error = _error(_materialize(training.promotion, home, after_last))
    assert f"no challenger evaluated on {after_last}" in error
    assert r.by_alias(reg.CTR, "champion").version == champion.version


@pytest.mark.breaks("onnx_model:parity_refusal")
def test_onnx_model_refuses_a_champion_whose_registered_graph_is_another_models(home):
    home, report = home
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")
    graphs = {p.parts[-5]: p for p in (home / "mlartifacts" / reg.CTR / "models").glob("*/artifacts/artifacts/serving/model.onnx")}
    own = graphs.pop(champion.source.removeprefix("models:/"))
    shutil.copy2(next(iter(graphs.values())), own)   # another candidate's graph under the champion's name
    day = champion.tags["evaluated_on"]
    error = _error(_materialize(training.onnx_model, home, day))
    assert f"genrank-ctr v{champion.version}: the exported graph differs from the checkpoint by" in error
    assert f"on {day}'s requests" in error
