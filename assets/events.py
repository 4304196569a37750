"""``events``: the Spark events job for one day, as a daily Dagster asset with its quality checks.

Glue only: the job is :func:`transforms.spark.events.run_events_job`, the checks are
:mod:`quality.events`. Upstream is the external ``raw_logs`` asset through a partition mapping that
covers D-1..D+1 (D-1's impressions recognise D's late clicks; D+1's clicks label D's impressions).

Late clicks and the grace period: D+1's files are due when D+1 ends. While D+1 is not complete and
``now`` is before ``end of D+1 + late_grace_hours`` the asset fails with a message saying it waits for
D+1 (a later run, e.g. from the landing sensor, picks it up); after that it runs without D+1 and
reports ``next_day_included = False`` (labels of clicks after midnight are missing until a rerun).

Checks (see :mod:`quality.events`): blocking ``events_not_empty``, ``events_schema``,
``events_keys_not_null``, ``events_impression_id_unique``, ``events_position_in_range``,
``events_ts_in_day``, ``events_label_binary``, ``events_row_accounting``, ``events_quarantine_rate``;
warnings ``events_ctr_drift``, ``events_quarantine_warning``, ``events_volume_drop``.

A day the source declares empty (``_SUCCESS`` lists zero lines) materialises a recorded empty
partition (metadata ``source_declared_empty``); files an operator set aside
(``genrank landing quarantine-file``) are reported as ``quarantined_files``.
"""


import datetime as dt
import time

import dagster as dg

from contracts import settings
from assets.partitions import daily_partitions
from assets.resources import GenrankPaths, SparkResource
from quality.events import EVENTS_CHECKS, EventsThresholds, QuarantineRates, RateLimit, validate_events
from quality.framework import to_check_results
from transforms import landing
from transforms.spark.events import run_events_job

from assets.raw_logs import raw_logs

RAW_LOGS_MAPPING = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=1,
                                                 allow_nonexistent_upstream_partitions=True)


_RATES = QuarantineRates()


class EventsConfig(dg.Config):
    attribution_window_min: float = settings.attribution_window_min()
    late_grace_hours: float = settings.late_grace_hours()
    verify_landing: bool = True
    ctr_band: float = 0.5
    ctr_z: float = 4.0
    # quarantine shares (quality.events.QuarantineRates): blocking above *_block, warning above *_warn
    quarantine_reason_warn: float = _RATES.per_reason.warn_above
    quarantine_reason_block: float = _RATES.per_reason.block_above
    quarantine_file_warn: float = _RATES.per_file.warn_above
    quarantine_file_block: float = _RATES.per_file.block_above
    quarantine_min_lines: int = _RATES.min_lines
    volume_drop_max: float = 0.5
    trailing_days: int = 7

    def thresholds(self) -> EventsThresholds:
        rates = QuarantineRates(per_reason=RateLimit(self.quarantine_reason_warn, self.quarantine_reason_block),
                                per_file=RateLimit(self.quarantine_file_warn, self.quarantine_file_block),
                                min_lines=self.quarantine_min_lines)
        return EventsThresholds(ctr_band=self.ctr_band, ctr_z=self.ctr_z, quarantine=rates,
                                volume_drop_max=self.volume_drop_max, trailing_days=self.trailing_days)


@dg.asset(
    partitions_def=daily_partitions(),
    group_name="ingest",
    deps=[dg.AssetDep(raw_logs, partition_mapping=RAW_LOGS_MAPPING)],
    check_specs=EVENTS_CHECKS.specs("events"),
    kinds={"spark", "parquet"},
    description=(
        "Unified, time-ordered event table of one UTC day (lake/events/date=D): impressions with label, "
        "click_type, dwell and position; organic behaviors. Bad lines go to lake/quarantine/date=D with a "
        "reason; row accounting (input = accepted + quarantined + duplicates) is reported and checked."
    ),
)
def events(context: dg.AssetExecutionContext, config: EventsConfig, spark: SparkResource,
           paths: GenrankPaths) -> dg.MaterializeResult:
    day = context.partition_key
    next_day = landing.shift_day(day, 1)
    decision = landing.next_day_decision(day, landing.is_complete(paths.root, next_day),
                                         dt.datetime.now(dt.timezone.utc), config.late_grace_hours)
    if decision == "wait":
        raise dg.Failure(
            description=(f"events {day}: waiting for landing {next_day} (late clicks of {day}'s impressions); "
                         f"it runs without it {config.late_grace_hours:g} h after {next_day} ends"),
            allow_retries=True,
        )
    if decision == "skip":
        context.log.warning(f"landing {next_day} is not complete after the grace period: {day} runs without "
                            "late clicks (labels after midnight missing until a rerun)")

    session = spark.get_session()
    result = run_events_job(session, paths.root, day, attribution_window_min=config.attribution_window_min,
                            use_next_day=(decision == "use"), verify_landing=config.verify_landing)
    context.log.info(result.summary())

    t0 = time.perf_counter()
    accounting = {k: vars(a) for k, a in result.accounting.items()}
    outcomes = validate_events(result.events_path, day, accounting=accounting, thresholds=config.thresholds(),
                               files=result.files, declared_empty=result.source_declared_empty)
    checks = to_check_results("events", EVENTS_CHECKS, outcomes)
    checks_s = time.perf_counter() - t0

    metadata: dict = {
        "dagster/row_count": result.events_rows,
        "events_rows": result.events_rows,
        "impressions": result.impressions,
        "behaviors": result.behaviors,
        "clicked_impressions": result.clicked_impressions,
        "ctr": result.ctr if result.ctr is not None else float("nan"),
        "input_lines": result.input_lines,
        "accepted": result.accepted,
        "quarantined": result.quarantined,
        "duplicates": result.duplicates,
        "quarantine_by_reason": dg.MetadataValue.json(result.quarantine_by_reason()),
        "duplicates_by_reason": dg.MetadataValue.json(result.duplicates_by_reason()),
        "late_clicks_attributed_previous_day": result.accounting["clicks"].accepted_by_reason.get("attributed_previous_day", 0),
        "accounting": dg.MetadataValue.json(accounting),
        "accounting_closes": result.accounting_closes,
        "blank_lines": sum(a.blank_lines for a in result.accounting.values()),
        "files": dg.MetadataValue.json(result.files),
        "quarantined_files": dg.MetadataValue.json(result.quarantined_files),
        "source_declared_empty": result.source_declared_empty,
        "next_day_included": result.next_day_included,
        # what the landing sensor compares to decide whether this day must run again
        "landing_fingerprint": landing.day_fingerprint(paths.root, day, include_next=(decision == "use")),
        "previous_day_included": result.previous_day_included,
        "attribution_window_min": result.attribution_window_min,
        "lines_read": result.lines_read,
        "duration_s": round(result.duration_s, 3),
        "rows_per_s": round(result.rows_per_s, 1),
        "checks_s": round(checks_s, 3),
        "events_path": dg.MetadataValue.path(result.events_path),
        "quarantine_path": dg.MetadataValue.path(result.quarantine_path),
        "spark_master": session.sparkContext.master,
    }
    for kind, a in result.accounting.items():
        metadata[f"{kind}_input_lines"] = a.input_lines
        metadata[f"{kind}_accepted"] = a.accepted
        metadata[f"{kind}_quarantined"] = a.quarantined
        metadata[f"{kind}_duplicates"] = a.duplicates
    return dg.MaterializeResult(metadata=metadata, check_results=checks)
