"""The command-line run's verdict: what makes `genrank run` exit non-zero."""

from pipelines.runner import DayResult, RunSummary


def test_a_refused_challenger_is_a_decision_but_a_failed_teacher_fails_the_run():
    refused = DayResult("2026-01-05", False, failed_checks=["challenger_evaluation:gate_auc"])
    ok = DayResult("2026-01-06", True)
    assert RunSummary([ok, refused]).ok
    assert not RunSummary([ok, DayResult("2026-01-07", False, error="teacher_model: out of memory")]).ok
    assert not RunSummary([ok, DayResult("2026-01-07", False, error="events: boom")]).ok
    assert not RunSummary([]).ok
