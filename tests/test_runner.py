"""The command-line run's verdict: what makes `genrank run` exit non-zero."""

from pipelines.runner import DayResult, RunSummary


def test_a_refused_challenger_is_a_decision_but_a_failed_teacher_fails_the_run():
    """A refusal is a successful day whose decision says so (its gates are WARN checks); a day whose run failed
    is FAILED whatever the checks say, and so is a successful one with a failed ERROR check."""
    refused = DayResult("2026-01-05", True, {"decision": "refused", "why": "challenger AUC 0.80 < champion AUC 0.82"})
    ok = DayResult("2026-01-06", True, {"decision": "approved"})
    assert (refused.status, ok.status) == ("refused", "ok")
    assert RunSummary([ok, refused]).ok
    stopped = DayResult("2026-01-07", False, failed_checks=["events:events_schema"], error="events: schema")
    assert stopped.status == "FAILED" and not RunSummary([ok, stopped]).ok
    assert DayResult("2026-01-07", True, failed_checks=["serving_monitor:drift"]).status == "FAILED"
    assert not RunSummary([ok, DayResult("2026-01-07", False, error="teacher_model: out of memory")]).ok
    assert not RunSummary([ok, DayResult("2026-01-07", False, error="events: boom")]).ok
    assert not RunSummary([]).ok


def test_a_run_without_a_champion_says_why_in_one_line():
    from pipelines.runner import _why_no_champion

    early = [DayResult("2015-11-02", True), DayResult("2015-11-03", True)]
    assert "no challenger was judged in these 2 day(s)" in _why_no_champion(early)
    refused = DayResult("2015-11-05", True, {"decision": "refused", "why": "challenger AUC 0.38 > baseline AUC 0.50: no"})
    assert _why_no_champion([*early, refused]) == ("1 challenger(s) judged, none promoted; the newest, on 2015-11-05: "
                                                   "challenger AUC 0.38 > baseline AUC 0.50: no.")
    crashed = DayResult("2015-11-04", False, error="events: boom")
    assert _why_no_champion([*early, crashed]) == "2015-11-04 failed (events: boom), so no challenger was judged."
    assert all("\n" not in _why_no_champion(r) for r in (early, [refused], [crashed]))


def test_landed_days_outside_the_partition_set_are_a_one_line_error_saying_what_to_do():
    import dagster as dg
    import pytest

    from assets.partitions import check_days_in_partitions

    partitions = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")
    check_days_in_partitions(["2026-01-01", "2026-01-05"], partitions)
    with pytest.raises(ValueError, match=r"^2 landed day\(s\) \(2015-11-02\.\.2015-11-03\) are before the first daily "
                                         r"partition 2026-01-01 .* unset GENRANK_START_DATE"):
        check_days_in_partitions(["2015-11-02", "2015-11-03", "2026-01-01"], partitions)
    with pytest.raises(ValueError, match=r"after the last complete day"):
        check_days_in_partitions(["2999-01-01"], partitions)


def test_the_first_partition_is_the_setting_else_the_first_landing_day_else_the_default(tmp_path, monkeypatch):
    import pytest

    from contracts import settings
    from assets.partitions import first_partition_day
    from transforms import landing

    monkeypatch.delenv("GENRANK_START_DATE", raising=False)
    assert first_partition_day(tmp_path) == settings.DEFAULT_START_DATE
    for day in ("2015-11-03", "2015-11-02"):
        landing.write_day(tmp_path, day, {"impressions": [], "clicks": [], "behaviors": []})
    assert first_partition_day(tmp_path) == "2015-11-02"
    monkeypatch.setenv("GENRANK_START_DATE", "2015-11-03")
    assert first_partition_day(tmp_path) == "2015-11-03"
    monkeypatch.setenv("GENRANK_START_DATE", "2015-11-31")
    with pytest.raises(ValueError, match="GENRANK_START_DATE='2015-11-31' is not an ISO date"):
        first_partition_day(tmp_path)
