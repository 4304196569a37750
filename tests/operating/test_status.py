"""`genrank status`, as the on-call engineer runs it."""

from __future__ import annotations


import dagster as dg
import pytest

from pipelines import cli, operating
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


def test_status_of_a_built_home_lists_days_aliases_and_the_store(tiny_pipeline, tmp_path, capsys):
    source, report, _ = tiny_pipeline
    home = copy_home(source, tmp_path / "home")
    assert cli.main(["status", "--home", str(home)]) == 0
    out = capsys.readouterr().out
    for day in report.days:
        assert f"  {day}  processed" in out
    assert "genrank-ctr@champion: v" in out and "out-of-time AUC" in out and "genrank-teacher@current: v" in out
    assert f"Online store: as of {report.days[-1]}" in out

    # a blocked day: the last day's run ended failed for its current content
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    [run] = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": report.days[-1]}), limit=1)
    instance.add_run_tags(run.run_id, {operating.BLOCKED_BY_TAG: "events:events_quarantine_rate",
                                       operating.BLOCKED_REASON_TAG: "malformed_json 31% of lines"})
    instance.report_run_failed(instance.get_run_by_id(run.run_id))
    assert cli.main(["status", "--home", str(home)]) == 1
    out = capsys.readouterr().out
    assert f"  {report.days[-1]}  BLOCKED" in out and "events:events_quarantine_rate: malformed_json 31% of lines" in out


def test_status_without_a_landing_zone_says_so_and_exits_2(tmp_path, capsys):
    assert cli.main(["status", "--home", str(tmp_path)]) == 2
    assert f"no landing zone at {tmp_path / 'landing'}" in capsys.readouterr().out
