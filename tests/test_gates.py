"""Promotion gates: what passes, what is refused, and the reasons they give."""

import pytest

from deploy.gates import GateConfig, evaluate_gates

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
