"""Model cards: what a reviewer reads on a version's registry page."""

from deploy.gates import GateResult
from deploy.model_card import ctr_card, teacher_card

TAGS = {"partition": "2026-01-03", "data_window": "2026-01-03..2026-01-03", "teacher_version": "1", "code_version": "abc123",
        "kd": "on: teacher v1 AUC 0.8100 > baseline AUC 0.6000 on the day's held-out slice: yes"}
CHALLENGER = {"auc": 0.78, "gauc": 0.66, "logloss": 0.21, "bucket0_calibration": 0.93, "bucket1_calibration": 1.12,
              "bucket1_calibration_se": 0.085}
REFERENCE = {"auc": 0.61, "gauc": float("nan"), "logloss": 0.24, "bucket0_calibration": 1.0}


def _gates(auc_passed: bool) -> list[GateResult]:
    return [GateResult("auc", auc_passed, 0.78, 0.61, "challenger AUC 0.7800 vs baseline 0.6100"),
            GateResult("calibration", True, 1.12, 2.0, "every bucket with >= 20 clicks within [0.5, 2]")]


def test_the_ctr_card_says_what_was_judged_against_what_and_why():
    card = ctr_card("4", TAGS, "2026-01-04", "baseline", CHALLENGER, REFERENCE, _gates(True), "approved", None,
                    "r123", "#/experiments/1/runs/r123")
    assert card.startswith("### genrank-ctr v4: approved on 2026-01-04")
    assert "training_samples 2026-01-03 (data window 2026-01-03..2026-01-03)" in card
    assert "**Distillation** on: teacher v1 AUC 0.8100 > baseline" in card and "abc123" in card and "against **baseline**" in card
    assert "| AUC | 0.7800 | 0.6100 |" in card and "| GAUC (per user) | 0.6600 | - |" in card
    assert "| bucket1 predicted/observed CTR | 1.1200 | - |" in card
    assert "| bucket1 its standard error (clustered by user) | 0.0850 | - |" in card
    assert "| auc | 0.7800 | 0.6100 | pass: challenger AUC 0.7800 vs baseline 0.6100 |" in card
    assert "**Decision: approved**, every gate passed" in card
    assert "[r123](#/experiments/1/runs/r123)" in card


def test_a_forced_card_names_who_forced_it_and_the_failed_gate():
    card = ctr_card("5", TAGS, "2026-01-04", "champion v4", CHALLENGER, REFERENCE, _gates(False), "forced",
                    "the challenger_evaluation config (force: true) of Dagster run abc", "r9", "#/x")
    assert "| auc | 0.7800 | 0.6100 | FAIL:" in card
    assert "**Decision: forced**, forced by the challenger_evaluation config (force: true) of Dagster run abc" in card


def test_the_teacher_card_lists_its_logits_auc_per_day():
    card = teacher_card("2", "2026-01-01..2026-01-05", "abc", {"2026-01-07": 0.856, "2026-01-06": 0.854}, "#/e/1/runs/x")
    assert "trained on training_samples 2026-01-01..2026-01-05" in card
    assert card.index("| 2026-01-06 | 0.8540 |") < card.index("| 2026-01-07 | 0.8560 |")


def test_the_ctr_card_has_a_shadow_scoring_section():
    from deploy.gates import ShadowResult

    shadow = ShadowResult(40, 212, 3.25, 0.93, 39, {0: 1.04, 1: 0.97})
    card = ctr_card("5", TAGS, "2026-01-04", "champion v4", CHALLENGER, REFERENCE, _gates(True), "approved", None,
                    "r9", "#/x", shadow)
    section = card[card.index("#### Shadow scoring"):card.index("| gate |")]
    assert "on 40 logged requests of the champion (212 candidates)" in section
    assert "**p99 scoring time** 3.2500 ms" in section and "Spearman rho) 0.9300 over 39 requests" in section
    assert "bucket 0 1.0400, bucket 1 0.9700" in section
    unserved = ctr_card("5", TAGS, "2026-01-04", "champion v4", CHALLENGER, REFERENCE, _gates(True), "approved", None,
                        "r9", "#/x", ShadowResult(not_scored="no logged requests of the champion v4 on 2026-01-04"))
    assert "Not shadow-scored: no logged requests of the champion v4 on 2026-01-04." in unserved
