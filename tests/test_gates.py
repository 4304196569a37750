"""Promotion gates: what passes, what is refused, and the reasons they give."""

import pytest

from deploy.gates import SHADOW_GATES, GateConfig, ShadowResult, evaluate_gates, shadow_gates

CHAMPION = {"auc": 0.70, "logloss": 0.20, "ctr": 0.05, "bucket0_calibration": 1.0, "bucket0_n": 2000,
            "bucket0_clicks": 100, "bucket0_calibration_se": 0.1, "bucket1_calibration": 1.1, "bucket1_n": 1000,
            "bucket1_clicks": 30, "bucket1_calibration_se": 0.2}


def _gates(challenger, reference=CHAMPION, name="champion v1", latency=5.0, cfg=GateConfig(), parity=1e-6,
           kind="champion"):
    return {g.name: g for g in evaluate_gates(challenger, reference, name, latency, parity, cfg, kind)}


def test_an_equal_challenger_passes_within_tolerances():
    gates = _gates({**CHAMPION, "auc": 0.699, "logloss": 0.204})
    assert all(g.passed for g in gates.values()), {k: g.reason for k, g in gates.items()}


@pytest.mark.breaks("challenger_evaluation:gate_auc", "challenger_evaluation:gate_logloss")
def test_worse_auc_and_logloss_are_refused_with_reasons():
    gates = _gates({**CHAMPION, "auc": 0.69, "logloss": 0.21})
    assert not gates["auc"].passed and "0.6900" in gates["auc"].reason and "champion v1" in gates["auc"].reason
    assert not gates["logloss"].passed and abs(gates["logloss"].threshold - 0.205) < 1e-12


@pytest.mark.breaks("challenger_evaluation:gate_auc")
def test_first_model_must_beat_the_baseline_auc_outright():
    baseline = {"auc": 0.60, "logloss": 0.20}
    assert not _gates({**CHAMPION, "auc": 0.60}, baseline, "baseline", kind="baseline")["auc"].passed
    assert not _gates({**CHAMPION, "auc": 0.599}, baseline, "baseline", kind="baseline")["auc"].passed
    assert _gates({**CHAMPION, "auc": 0.601, "logloss": 0.2049}, baseline, "baseline", kind="baseline")["logloss"].passed
    # what decides "first model" is the registry's answer, not the reference's display name
    assert _gates({**CHAMPION, "auc": 0.599}, baseline, "baseline", kind="champion")["auc"].passed


@pytest.mark.breaks("challenger_evaluation:gate_calibration")
def test_calibration_band_is_widened_by_two_user_clustered_standard_errors():
    # se 0.1: [0.8, 1.25] -> [0.6, 1.45]
    gate = _gates({**CHAMPION, "bucket0_calibration": 0.61})["calibration"]
    assert gate.passed and "bucket 0: 0.6100 (allowed [0.600, 1.450]: 2 SE = 0.200 at 100 clicks)" in gate.reason
    assert not _gates({**CHAMPION, "bucket0_calibration": 0.59})["calibration"].passed
    assert _gates({**CHAMPION, "bucket0_calibration": 1.44})["calibration"].passed
    assert not _gates({**CHAMPION, "bucket0_calibration": 1.46})["calibration"].passed
    # the clicks alone do not narrow it: many clicks from a few heavy users are still a noisy day
    assert _gates({**CHAMPION, "bucket0_clicks": 10_000, "bucket0_calibration": 1.44})["calibration"].passed
    # production volume: the band is nearly the bare one
    many = {**CHAMPION, "bucket0_clicks": 10_000, "bucket0_calibration_se": 0.005}
    assert not _gates({**many, "bucket0_calibration": 0.78})["calibration"].passed
    assert _gates({**many, "bucket0_calibration": 0.80})["calibration"].passed
    gate = _gates({**many, "bucket0_calibration": 1.3})["calibration"]
    assert not gate.passed and "bucket 0: 1.3000" in gate.reason and "10000 clicks" in gate.reason
    assert "2 SE = 0.010" in gate.reason


@pytest.mark.breaks("challenger_evaluation:gate_calibration")
def test_calibration_judges_only_buckets_with_enough_clicks():
    skewed = {**CHAMPION, "bucket1_calibration": 3.0, "bucket1_clicks": 10}
    assert _gates(skewed)["calibration"].passed  # 10 clicks: too few to judge
    gate = _gates({**skewed, "bucket1_clicks": 25})["calibration"]
    assert not gate.passed and "bucket 1: 3.0000" in gate.reason
    # all the clicks from one user: no spread to measure the noise by, not judged
    assert _gates({**skewed, "bucket1_clicks": 25, "bucket1_calibration_se": float("nan")})["calibration"].passed


@pytest.mark.breaks("challenger_evaluation:gate_latency")
def test_latency_budget():
    assert not _gates(CHAMPION, latency=51.0)["latency"].passed
    assert _gates(CHAMPION, latency=49.0)["latency"].passed


@pytest.mark.breaks("challenger_evaluation:gate_onnx_parity")
def test_onnx_parity_gate():
    assert _gates(CHAMPION, parity=9e-5)["onnx_parity"].passed
    refused = _gates(CHAMPION, parity=3e-3)["onnx_parity"]
    assert not refused.passed and "3.00e-03" in refused.reason
    assert not _gates(CHAMPION, parity=float("nan"))["onnx_parity"].passed  # a version without a graph


@pytest.mark.breaks("challenger_evaluation:gate_onnx_parity", "challenger_evaluation:gate_latency")
def test_nothing_measured_fails_the_onnx_gates_with_that_reason():
    gates = _gates(CHAMPION, latency=float("nan"), parity=float("nan"))
    for name in ("onnx_parity", "latency"):
        assert not gates[name].passed and gates[name].reason.startswith("nothing measured"), gates[name].reason


def test_calibration_with_no_bucket_to_judge_says_so():
    few = {**CHAMPION, "bucket0_clicks": 3, "bucket1_clicks": 2, "bucket1_calibration": 5.0}
    gate = _gates(few)["calibration"]
    assert gate.passed and gate.reason.startswith("NOT JUDGED: no position bucket reached 20 clicks")


def test_a_rerun_after_promotion_is_reported_as_a_comparison_with_itself():
    gates = _gates(CHAMPION, CHAMPION, "champion v3", kind="itself")
    for name in ("auc", "logloss"):
        assert gates[name].passed and "compares the model with itself" in gates[name].reason


def test_zero_requests_measure_nothing_instead_of_zero():
    import math

    from deploy.onnx_export import latency_p99_ms, parity

    assert math.isnan(latency_p99_ms(None, []))
    report = parity(None, None, [])
    assert report.candidates == 0 and math.isnan(report.max_abs_diff) and not report.passed


def test_an_unknown_reference_kind_is_refused_naming_the_known_ones():
    from deploy.gates import REFERENCE_KINDS

    with pytest.raises(ValueError, match="reference_kind 'champoin': one of " + ", ".join(REFERENCE_KINDS)):
        _gates(CHAMPION, kind="champoin")


def _shadow(**changes) -> ShadowResult:
    return ShadowResult(**{"requests": 40, "candidates": 200, "latency_p99_ms": 4.0, "rank_correlation": 0.9,
                           "ranked_requests": 38, "mean_shift": {0: 1.05, 1: 0.95}, **changes})


def test_a_faithful_fast_shadow_scoring_passes_the_three_shadow_gates():
    gates = {g.name: g for g in shadow_gates(_shadow(), GateConfig(latency_budget_ms=50.0))}
    assert set(gates) == set(SHADOW_GATES) and all(g.passed for g in gates.values()), gates
    assert "p99 request scoring (onnxruntime) 4.0 ms on 40 logged requests of the champion (200 candidates)" \
        in gates["shadow_latency"].reason
    assert "Spearman rho with the champion's served scores 0.9000 over 38 ranked requests" in gates["shadow_rank"].reason
    assert "inside [0.64, 1.5625]: bucket 0: 1.0500, bucket 1: 0.9500" in gates["shadow_calibration_shift"].reason


@pytest.mark.breaks("challenger_evaluation:gate_shadow_latency", "challenger_evaluation:gate_shadow_rank",
                    "challenger_evaluation:gate_shadow_calibration_shift")
def test_slow_reordering_or_shifting_shadow_scores_fail_their_gates_with_reasons():
    slow = {g.name: g for g in shadow_gates(_shadow(latency_p99_ms=51.0), GateConfig(latency_budget_ms=50.0))}
    assert not slow["shadow_latency"].passed and "51.0 ms" in slow["shadow_latency"].reason
    assert "not <= budget 50.0 ms" in slow["shadow_latency"].reason
    reversed_ = {g.name: g for g in shadow_gates(_shadow(rank_correlation=-0.8))}
    assert not reversed_["shadow_rank"].passed and "-0.8000" in reversed_["shadow_rank"].reason
    assert "not >= 0.5" in reversed_["shadow_rank"].reason and reversed_["shadow_rank"].threshold == 0.5
    assert {g.name: g.passed for g in shadow_gates(_shadow(rank_correlation=0.5))}["shadow_rank"]
    shifted = {g.name: g for g in shadow_gates(_shadow(mean_shift={0: 1.0, 1: 0.6}))}["shadow_calibration_shift"]
    assert not shifted.passed and (shifted.observed, shifted.threshold) == (0.6, 0.64) and "outside [0.64, 1.5625]" in shifted.reason
    assert "bucket 1: 0.6000" in shifted.reason
    assert {g.name: g.passed for g in shadow_gates(_shadow(mean_shift={0: 1.56, 1: 0.65}))}["shadow_calibration_shift"]
    assert not {g.name: g for g in shadow_gates(_shadow(latency_p99_ms=float("nan")))}["shadow_latency"].passed


def test_nothing_logged_passes_the_shadow_gates_with_that_reason():
    gates = shadow_gates(ShadowResult(not_scored="no logged requests of the champion v3 on 2026-01-05"))
    assert [g.name for g in gates] == list(SHADOW_GATES) and all(g.passed for g in gates)
    assert {g.reason for g in gates} == {"not shadow-scored: no logged requests of the champion v3 on 2026-01-05"}
    unranked = {g.name: g for g in shadow_gates(_shadow(rank_correlation=float("nan"), ranked_requests=0))}
    assert unranked["shadow_rank"].passed and unranked["shadow_rank"].reason.startswith("NOT JUDGED")
