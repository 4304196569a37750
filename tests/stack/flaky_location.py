"""The genrank code location with one transient fault, for the stack scenario (test_stack.py): the dbt step
of the day named by GENRANK_TEST_FAIL_ONCE ("DAY:MARKER_PATH") fails the first time it runs (the marker file
records that it did). Everything else is pipelines.definitions unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pipelines.definitions as genrank
from assets.sequences import EnvironmentDbt


class FlakyDbt(EnvironmentDbt):
    fail_once: str = ""

    def cli(self, args, **kwargs):
        day, _, marker = self.fail_once.partition(":")
        context = kwargs.get("context")
        if marker and context is not None and context.partition_key_range.start == day and not Path(marker).exists():
            Path(marker).write_text(day)
            raise RuntimeError(f"injected transient failure of the dbt step on {day}")
        return super().cli(args, **kwargs)


_dbt = genrank.defs.resources["dbt"]
defs = dg.Definitions(
    assets=genrank.defs.assets, asset_checks=genrank.defs.asset_checks, jobs=genrank.defs.jobs,
    schedules=genrank.defs.schedules, sensors=genrank.defs.sensors,
    resources={**genrank.defs.resources,
               "dbt": FlakyDbt(project_dir=_dbt.project_dir, profiles_dir=_dbt.profiles_dir,
                               dbt_executable=_dbt.dbt_executable, fail_once=os.environ.get("GENRANK_TEST_FAIL_ONCE", ""))},
)
