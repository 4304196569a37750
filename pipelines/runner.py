"""Run the daily job over landed days from the command line, recording runs in the Dagster instance.

This is what ``genrank run`` / ``genrank demo`` (README command 1) call: the same job the schedule and
sensor launch, executed in process one partition after another, in order, so that each day sees the
state its predecessor left (warm-starts, incremental sequences). The runs land in
``$GENRANK_HOME/dagster_home`` and show in ``dagster dev`` afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import settings
from transforms import landing

INSTANCE_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    granularity: op
    default_limit: 1
"""


def prepare_instance(home: Path):
    """The persistent Dagster instance under GENRANK_HOME (unless DAGSTER_HOME is set)."""
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        dagster_home = home / "dagster_home"
        dagster_home.mkdir(parents=True, exist_ok=True)
        cfg = dagster_home / "dagster.yaml"
        if not cfg.exists():
            cfg.write_text(INSTANCE_YAML)
        os.environ["DAGSTER_HOME"] = str(dagster_home)
    return dg.DagsterInstance.get()


@dataclass
class DayResult:
    day: str
    success: bool
    figures: dict[str, object] = field(default_factory=dict)
    failed_checks: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class RunSummary:
    days: list[DayResult]

    @property
    def ok(self) -> bool:
        return bool(self.days) and all(d.success and not d.failed_checks for d in self.days)


# Metadata keys worth a column in the printed per-day summary, per asset.
SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    "events": ("impressions", "clicks", "ctr", "behaviors", "quarantined", "duplicates"),
}


def run_days(start: str | None, end: str | None, home: Path | None = None) -> RunSummary:
    home = home or settings.genrank_home()
    days = [d for d in landing.complete_days(home) if (start is None or d >= start) and (end is None or d <= end)]
    if not days:
        raise ValueError(f"no complete landing day under {home / 'landing'} in [{start or '-'}, {end or '-'}]: "
                         "run `genrank simulate` or `genrank import` first")
    instance = prepare_instance(home)
    from pipelines.definitions import defs

    job = defs.resolve_job_def("daily_job")
    landed = set(landing.complete_days(home))
    results = []
    for day in days:
        next_missing = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat() not in landed
        result = job.execute_in_process(
            partition_key=day, instance=instance, raise_on_error=False,
            tags={"genrank/next_day_missing": str(next_missing).lower(), "genrank/launched_by": "cli"},
        )
        results.append(_summarise(day, result))
        print(_format_day(results[-1]), flush=True)
    summary = RunSummary(results)
    print(f"\n{sum(r.success for r in results)}/{len(results)} days succeeded; Dagster runs are in "
          f"{os.environ['DAGSTER_HOME']} (open them with `dagster dev -w workspace.yaml`)")
    return summary


def _summarise(day: str, result) -> DayResult:
    figures: dict[str, object] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        asset = mat.asset_key.to_user_string()
        for key in SUMMARY_KEYS.get(asset, ()):
            if key in mat.metadata:
                figures[f"{asset}.{key}"] = mat.metadata[key].value
    failed = [
        f"{e.asset_key.to_user_string()}:{e.check_name}"
        for e in result.get_asset_check_evaluations()
        if not e.passed and e.severity.value == "ERROR"
    ]
    error = None
    if not result.success:
        failure = result.get_run_failure_event()
        error = failure.message if failure else "run failed"
        for step in result.get_step_failure_events():
            cause = step.event_specific_data.error
            while cause.cause is not None:  # the user's exception, not Dagster's wrapper
                cause = cause.cause
            error = f"{step.step_key}: {cause.message.strip()}"
    return DayResult(day, result.success, figures, failed, error)


def _format_day(r: DayResult) -> str:
    status = "ok" if r.success and not r.failed_checks else "FAILED"
    parts = [f"{r.day}  {status:6s}"]
    parts += [f"{k.split('.', 1)[1]}={_fmt(v)}" for k, v in r.figures.items()]
    if r.failed_checks:
        parts.append("failed checks: " + ", ".join(r.failed_checks))
    if r.error:
        parts.append(f"error: {r.error}")
    return "  ".join(parts)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
