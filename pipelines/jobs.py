"""Jobs and the daily schedule: the daily run per partition, and the on-demand teacher retrain."""

import warnings

import dagster as dg

from pipelines import operating
from pipelines.stage_profile import return_freed_heap
from assets.resources import GenrankPaths

TEACHER = dg.AssetSelection.assets("teacher_model")


@dg.success_hook(name="return_freed_heap")
def return_freed_heap_after_step(context: dg.HookContext) -> None:
    """After every step of an in-process run: what the step freed goes back to the OS before the next step
    (stage_profile.return_freed_heap). On a `large` day the steps after the teacher's logits and the student
    sit 0.2-0.4 GB lower; the largest step's own peak does not move (benchmarks/RESULTS.md, "Day 5 alone")."""
    return_freed_heap()

# Every launcher (the landing sensor, the schedule, a daily_job backfill from the UI, `genrank run`) runs
# this one job per day. It holds the teacher too: teacher_model retrains inside the day's run when its
# cadence says so (assets/training.py teacher_due), so every launcher gets the teacher exactly where
# `genrank run` does.
# A daily_job backfill runs one run per day by design; the dbt stage's single-run policy is for range
# backfills from the asset graph. Dagster warns about the mix every time the job resolves: expected here.
warnings.filterwarnings("ignore", message="Asset job daily_job materializes assets with varying BackfillPolicies")

daily_job = dg.define_asset_job(
    "daily_job",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("raw_logs"),
    description="Everything downstream of the landing zone for one day: events, sequences, the teacher when "
                "due, teacher logits, the student candidate, yesterday's candidate's gates and promotion.",
    # Transient failures (a lost Spark executor, a locked file) retry the run once from the failed step; a
    # failed blocking check turns its run's retry off (operating.mark_blocked_run). The lane tag is what
    # the run queue serialises on (pipelines/runner.py INSTANCE_YAML, deploy/dagster.yaml).
    tags={"dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE",
          operating.LANE_TAG: operating.DAILY_LANE},
    hooks={operating.mark_blocked_run, return_freed_heap_after_step},
    # One process runs the day's steps in order (they form a chain): no per-step process re-importing
    # torch and Spark, and the same execution `genrank run` does in process.
    executor_def=dg.in_process_executor,
)

teacher_job = dg.define_asset_job(
    "teacher_job", selection=TEACHER,
    description="Retrain the full-token teacher now, over the trailing window of training samples "
                "(then backfill teacher_logits to re-cache them).",
    tags={operating.LANE_TAG: operating.DAILY_LANE},
    executor_def=dg.in_process_executor,
)


@dg.schedule(job=daily_job, cron_schedule="0 7 * * *", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.STOPPED)
def daily_schedule(context: dg.ScheduleEvaluationContext, paths: GenrankPaths):
    """07:00 UTC: the landing sensor's decision at a fixed time, for deployments that turn the sensor off
    (start one of the two). It never requests a day that is done, waiting or blocked."""
    return operating.next_run(context, paths, context.log)
