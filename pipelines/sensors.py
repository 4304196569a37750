"""The landing sensor: notices complete landing days and starts the daily run for the day they complete.

Day D is processed once D+1 has landed (late clicks of D arrive in D+1's files). Without D+1 it is
processed once D+1 has ended plus ``GENRANK_LATE_GRACE_HOURS`` (the events asset's rule), tagged
``genrank/next_day_missing=true``; when D+1 lands later, D runs again (a rerun replaces it exactly).
"""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg

from assets.events import next_day_decision
from pipelines import settings
from pipelines.jobs import daily_job
from pipelines.resources import GenrankPaths
from transforms import landing


def _next(day: str) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()


def ready_partitions(complete: list[str], grace_hours: float, now: dt.datetime) -> list[tuple[str, bool]]:
    """(day, next_day_missing) for every landed day whose inputs are ready now (the events asset's rule)."""
    have = set(complete)
    ready = []
    for day in complete:
        decision = next_day_decision(day, _next(day) in have, now, grace_hours)
        if decision != "wait":
            ready.append((day, decision == "skip"))
    return ready


@dg.sensor(job=daily_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def landing_sensor(context: dg.SensorEvaluationContext, paths: GenrankPaths) -> dg.SensorResult:
    reported = set(json.loads(context.cursor)) if context.cursor else set()
    complete = landing.complete_days(paths.root)
    new_days = [d for d in complete if d not in reported]
    events = []
    for day in new_days:
        counts = json.loads((landing.day_dir(paths.root, day) / landing.SUCCESS_MARKER).read_text() or "{}")
        events.append(dg.AssetMaterialization(
            asset_key="raw_logs", partition=day,
            metadata={"path": str(landing.day_dir(paths.root, day)), "lines": dg.MetadataValue.json(counts.get("files", {}))},
        ))
    grace = float(settings.env("GENRANK_LATE_GRACE_HOURS", "6"))
    runs = [
        dg.RunRequest(
            partition_key=day,
            # A run key per readiness state: the grace-period run and the later complete run are distinct.
            run_key=f"{day}:{'grace' if missing else 'complete'}",
            tags={"genrank/next_day_missing": str(missing).lower()},
        )
        for day, missing in ready_partitions(complete, grace, dt.datetime.now(dt.timezone.utc))
    ]
    return dg.SensorResult(run_requests=runs, asset_events=events, cursor=json.dumps(sorted(reported | set(new_days))))
