"""The landing sensor: reports complete landing days and starts the daily run of the next day that needs one.

Day D is ready once D+1 has landed (late clicks of D arrive in D+1's files), or once D+1 has ended plus
``GENRANK_LATE_GRACE_HOURS`` (the events asset's rule), tagged ``genrank/next_day_missing=true``; when
D+1 lands later, D's inputs have changed and it runs again (a rerun replaces it exactly). What runs next
and when is :func:`pipelines.operating.plan_next_day`: one day at a time, in date order, never a day that
is already done for its current landing content.
"""

from __future__ import annotations

import json

import dagster as dg

from contracts import settings
from pipelines import operating
from pipelines.jobs import daily_job
from assets.resources import GenrankPaths
from transforms import landing, landing_watch


@dg.sensor(job=daily_job, minimum_interval_seconds=settings.sensor_interval_s(),
           default_status=dg.DefaultSensorStatus.RUNNING)
def landing_sensor(context: dg.SensorEvaluationContext, paths: GenrankPaths) -> dg.SensorResult:
    # The cursor only decides which landed days are reported as raw_logs materialisations (again when a
    # day's content changed); what runs is decided from the instance.
    reported: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    events, current = [], {}
    for day in landing_watch.scan(paths.root).complete:
        current[day] = landing.day_fingerprint(paths.root, day, include_next=False)
        if reported.get(day) != current[day]:
            counts = json.loads((landing.day_dir(paths.root, day) / landing.SUCCESS_MARKER).read_text() or "{}")
            events.append(dg.AssetMaterialization(
                asset_key="raw_logs", partition=day,
                metadata={"path": str(landing.day_dir(paths.root, day)), "fingerprint": current[day],
                          "lines": dg.MetadataValue.json(counts.get("files", {}))}))
    decision = operating.next_run(context, paths, context.log)
    cursor = json.dumps(current, sort_keys=True)
    if isinstance(decision, dg.SkipReason):
        return dg.SensorResult(skip_reason=decision, asset_events=events, cursor=cursor)
    return dg.SensorResult(run_requests=[decision], asset_events=events, cursor=cursor)
