"""Jobs and schedules: the daily run per partition, and the weekly teacher retrain."""

import dagster as dg

from pipelines.partitions import daily_partitions

TEACHER = dg.AssetSelection.assets("teacher_model")

daily_job = dg.define_asset_job(
    "daily_job",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("raw_logs") - TEACHER,
    partitions_def=daily_partitions,
    description="Everything downstream of the landing zone for one day: events, sequences, teacher "
                "logits, the student candidate, yesterday's candidate's gates and promotion.",
    # transient failures (a lost Spark executor, a locked file) retry the run once
    tags={"dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"},
)

teacher_job = dg.define_asset_job(
    "teacher_job", selection=TEACHER,
    description="Retrain the full-token teacher over the trailing window of training samples.",
)

# The daily run processes yesterday: the schedule fires after midnight UTC plus the grace period the
# late-click attribution needs (clicks of D land in D+1's files).
daily_schedule = dg.build_schedule_from_partitioned_job(
    daily_job, hour_of_day=7, minute_of_hour=0, default_status=dg.DefaultScheduleStatus.RUNNING,
)

weekly_teacher_schedule = dg.ScheduleDefinition(
    job=teacher_job, cron_schedule="0 3 * * 1", execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
