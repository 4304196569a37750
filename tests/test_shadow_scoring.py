"""Shadow scoring before promotion (deploy/evaluation.py shadow_score, deploy/gates.py shadow_gates): the challenger
scores the champion's logged requests of the day; a day nobody served is "not shadow-scored" without loading a
model; on a day replayed through `genrank serve` the real next-day candidate ranks like the champion, and the same
scores negated or shuffled within each request fail the rank gate."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from deploy import evaluation
from deploy import registry as reg
from deploy.gates import GateConfig, shadow_gates
from deploy.monitoring import lake_requests, offline_scores
from transforms import landing


def test_rank_correlation_is_spearman_and_undefined_without_two_distinct_scores():
    a = np.array([0.1, 0.4, 0.2, 0.3])
    assert evaluation.rank_correlation(a, a ** 2) == pytest.approx(1.0)      # same order, other values
    assert evaluation.rank_correlation(a, 1 - a) == pytest.approx(-1.0)
    assert evaluation.rank_correlation(a, np.array([1.0, 2.0, 4.0, 3.0])) == pytest.approx(0.2)
    assert np.isnan(evaluation.rank_correlation(a[:1], a[:1]))
    assert np.isnan(evaluation.rank_correlation(a, np.full(4, 0.2)))


def test_compare_shadow_averages_per_request_and_shifts_per_bucket():
    served = [{"scores": [[0.1, 0.2], [0.3, 0.4], [0.2, 0.1]]}, {"scores": [[0.5, 0.5]]}]
    same_order = [np.array([[0.2, 0.3], [0.6, 0.5], [0.4, 0.2]]), np.array([[0.5, 0.5]])]
    got = evaluation.compare_shadow(served, same_order, 2.0)
    # the one-candidate request has no rank correlation; the means count every candidate
    assert got.requests == 2 and got.candidates == 4 and got.ranked_requests == 1
    assert got.rank_correlation == pytest.approx(1.0) and got.latency_p99_ms == 2.0
    assert got.mean_shift == pytest.approx({0: 1.7 / 1.1, 1: 1.5 / 1.2})
    reversed_ = evaluation.compare_shadow(served, [1 - s for s in same_order], 2.0)
    assert reversed_.rank_correlation == pytest.approx(-1.0)


def test_a_day_without_a_prediction_log_is_not_shadow_scored_and_loads_no_model(tmp_path):
    """The registry is None: any model loading would fail."""
    got = evaluation.shadow_score(tmp_path, None, "4", "3", tmp_path / "prediction_log", "2026-01-05", 500)
    assert got.not_scored == "no logged requests of the champion v3 on 2026-01-05" and got.requests == 0
    assert all(g.passed and g.reason == f"not shadow-scored: {got.not_scored}" for g in shadow_gates(got))
    assert evaluation.shadow_score(tmp_path, None, "4", None, None, "2026-01-05", 500).not_scored.startswith(
        "no champion yet")
    assert "is the champion v4" in evaluation.shadow_score(tmp_path, None, "4", "4", None, "2026-01-05", 500).not_scored


@pytest.mark.slow
def test_the_simulated_run_records_its_days_as_not_shadow_scored(tiny_pipeline):
    """Nothing is served during `genrank run`: every evaluated day's gates.json holds the three shadow gates,
    passed as not shadow-scored, and the evaluated version's card says so."""
    home = tiny_pipeline[0]
    evaluated = sorted((home / "lake" / "evaluations").glob("date=*/gates.json"))
    assert evaluated
    for path in evaluated:
        gates = {g["name"]: g for g in json.loads(path.read_text())["gates"]}
        for name in ("shadow_latency", "shadow_rank", "shadow_calibration_shift"):
            assert gates[name]["passed"] and gates[name]["reason"].startswith("not shadow-scored: "), gates[name]
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")
    assert "#### Shadow scoring" in champion.description and "Not shadow-scored: " in champion.description


@pytest.fixture(scope="module")
def replayed_day(tiny_pipeline, tmp_path_factory):
    """The tiny run's last day, its first 40 requests replayed over HTTP through `genrank serve` (the champion):
    (home with the prediction log, registry, day, the champion's version)."""
    from deploy.replay import replay
    from tests.deploy.test_service import _serving

    src = tiny_pipeline[0]
    home = tmp_path_factory.mktemp("shadow") / "home"
    home.mkdir()
    shutil.copy2(src / "mlflow.db", home / "mlflow.db")   # artifacts stay where the run logged them
    shutil.copytree(src / "online_store", home / "online_store")
    for dataset in ("user_sequences", "item_windows"):   # what the offline re-scoring reads of the lake
        shutil.copytree(src / "lake" / dataset, home / "lake" / dataset)
    day = landing.complete_days(src)[-1]
    with _serving(home, GENRANK_SERVE_PREDICTION_LOG=str(home / "prediction_log")) as (_, url):
        sent = replay(src, day, url, max_requests=40)
    assert sent.count(200, 300) >= 30, sent.summary()
    registry = reg.Registry(f"sqlite:///{home / 'mlflow.db'}", src / "mlartifacts")
    return home, registry, day, str(registry.by_alias(reg.CTR, "champion").version)


@pytest.mark.slow
@pytest.mark.breaks("challenger_evaluation:gate_shadow_rank")
def test_the_next_candidate_shadow_scores_the_served_requests_and_reversed_scores_fail_the_rank_gate(replayed_day):
    home, r, day, champion = replayed_day
    challenger = str(r.find(reg.CTR, partition=day).version)   # trained on the served day: tomorrow's challenger
    assert challenger != champion
    records = evaluation.champion_requests(home / "prediction_log", day, champion, 500)
    shadow = evaluation.shadow_score(home, r, challenger, champion, home / "prediction_log", day, 500)
    assert shadow.not_scored is None and shadow.requests == len(records) >= 30
    assert 0 < shadow.latency_p99_ms < float("inf") and shadow.ranked_requests >= 20
    assert 0.5 <= shadow.rank_correlation <= 1.0, shadow
    assert all(0 < v < float("inf") for v in shadow.mean_shift.values()) and len(shadow.mean_shift) >= 2
    gates = {g.name: g for g in shadow_gates(shadow, GateConfig(latency_budget_ms=1e9))}
    assert all(g.passed for g in gates.values()), gates

    # the champion itself on its own logged requests ranks them as it served them
    itself = evaluation.compare_shadow(records, offline_scores(home, r, reg.CTR, champion, records), 1.0)
    assert itself.rank_correlation > 0.999 and itself.mean_shift == pytest.approx({k: 1.0 for k in shadow.mean_shift}, abs=1e-4)

    scorer, requests = lake_requests(home, r, reg.CTR, challenger, records)
    scores = [scorer.score_tokens(t) for t in requests]
    assert evaluation.compare_shadow(records, scores, 1.0).rank_correlation == pytest.approx(shadow.rank_correlation)
    negated = evaluation.compare_shadow(records, [1 - s for s in scores], 1.0)
    assert negated.rank_correlation == pytest.approx(-shadow.rank_correlation)
    rng = np.random.default_rng(0)
    shuffled = evaluation.compare_shadow(records, [s[rng.permutation(len(s))] for s in scores], 1.0)
    for bad in (negated, shuffled):
        rank = {g.name: g for g in shadow_gates(bad)}["shadow_rank"]
        assert not rank.passed and "not >= 0.5" in rank.reason, rank.reason
