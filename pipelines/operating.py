"""The operating mode: what the landing sensor (and the optional daily schedule) run next, and how a run
that a blocking check stopped is marked so that nothing retries it in a loop.

One day at a time, in date order. A day's state lives in the Dagster instance, not in a sensor cursor:
- **done** when the newest ``events`` materialisation of the day carries the landing fingerprint the
  day has now (``transforms.landing.day_fingerprint``) and the run that made it, or its retry,
  succeeded (a challenger the promotion gates refused is a decision inside a successful run);
- **blocked** when a run was already requested for the day's current content and ended failed: a
  failed blocking check, or a step that failed again after its one retry. It stays blocked until the
  landing content changes (a replaced file, ``genrank landing quarantine-file``) or an operator reruns the
  day (the UI's "Materialize", a daily_job backfill, ``genrank run --start D --end D``);
- **new** otherwise: requested, with a run key of (day, fingerprint), so it is requested once per content.
Nothing is requested while any run of the instance is queued, running or waiting for its retry: the
daily state depends on the day before (sequences, warm starts, the teacher's cadence), so the next day
is decided only once the previous one has ended. Days after a blocked or waiting day wait too.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

from contracts import settings
from assets.partitions import daily_partitions
from assets.resources import GenrankPaths
from transforms import landing, landing_watch

LANE_TAG = "genrank/lane"              # the run queue admits one run of this lane at a time
DAILY_LANE = "daily"
FINGERPRINT_TAG = "genrank/landing_fingerprint"
NEXT_DAY_MISSING_TAG = "genrank/next_day_missing"
BLOCKED_BY_TAG = "genrank/blocked_by"          # failed blocking checks, "asset:check" comma-separated
BLOCKED_REASON_TAG = "genrank/blocked_reason"  # the first failed check's description
RELEASE_HINT = ("release it by fixing its landing files (replace the file, or `genrank landing quarantine-file "
                "PATH --reason TEXT`) or by rerunning the day (UI: Materialize; `genrank run --start D --end D`)")


@dataclass(frozen=True)
class DayRequest:
    day: str
    fingerprint: str
    next_day_missing: bool

    @property
    def run_key(self) -> str:
        return f"{self.day}:{self.fingerprint}"

    @property
    def tags(self) -> dict[str, str]:
        return {FINGERPRINT_TAG: self.fingerprint, NEXT_DAY_MISSING_TAG: str(self.next_day_missing).lower()}


@dataclass(frozen=True)
class Plan:
    request: DayRequest | None
    reason: str                       # why this request, or why nothing is requested
    problems: list[str] = field(default_factory=list)   # landing entries skipped, for the sensor's log


@dataclass(frozen=True)
class DayStatus:
    day: str
    state: str        # done | running | blocked | waiting | new
    why: str
    request: DayRequest | None = None


def day_statuses(instance: dg.DagsterInstance, root: Path, now: dt.datetime, grace_hours: float,
                 days: list[str], landed: set[str]):
    """Each day's state in date order (a generator: the planner stops at the first day not done)."""
    for day in days:
        next_day = landing.shift_day(day, 1)
        decision = landing.next_day_decision(day, next_day in landed, now, grace_hours)
        if decision == "wait":
            yield DayStatus(day, "waiting", f"{day} waits for landing {next_day} (its late clicks) or the end of "
                                            f"the {grace_hours:g} h grace period after it")
            continue
        fingerprint = landing.day_fingerprint(root, day, include_next=(decision == "use"))
        state, why = day_state(instance, day, fingerprint)
        yield DayStatus(day, state, why, DayRequest(day, fingerprint, decision == "skip"))


def plan_next_day(instance: dg.DagsterInstance, root: Path, now: dt.datetime, grace_hours: float,
                  partition_keys: set[str] | None = None) -> Plan:
    """The next day to run, or why none: see the module docstring for the rules."""
    found = landing_watch.scan(root)
    days = [d for d in found.complete if partition_keys is None or d in partition_keys]
    found.problems.extend(f"{landing.day_dir(root, d)}: not a daily partition (before GENRANK_START_DATE or in "
                          "the future); skipped" for d in found.complete if d not in days)
    busy = _busy(instance)
    if busy:
        return Plan(None, busy, found.problems)
    for status in day_statuses(instance, root, now, grace_hours, days, set(found.complete)):
        if status.state == "done":
            continue
        if status.state == "blocked":
            return Plan(None, f"{status.day} is blocked: {status.why}; {RELEASE_HINT}", found.problems)
        return Plan(status.request if status.state == "new" else None, status.why, found.problems)
    return Plan(None, f"all {len(days)} landed day(s) are done" if days else "no complete landing day", found.problems)


def next_run(context: dg.SensorEvaluationContext | dg.ScheduleEvaluationContext, paths: GenrankPaths,
             log) -> dg.RunRequest | dg.SkipReason:
    """The planner's decision as a run request, or the reason nothing runs (shared by sensor and schedule)."""
    now = dt.datetime.now(dt.timezone.utc)
    keys = set(daily_partitions().get_partition_keys(current_time=now))
    plan = plan_next_day(context.instance, paths.root, now, settings.late_grace_hours(), keys)
    for problem in plan.problems:
        log.warning(problem)
    if plan.request is None:
        return dg.SkipReason(plan.reason)
    log.info(f"requesting {plan.request.day}: {plan.reason}")
    return dg.RunRequest(partition_key=plan.request.day, run_key=plan.request.run_key, tags=plan.request.tags)


def day_state(instance: dg.DagsterInstance, day: str, fingerprint: str) -> tuple[str, str]:
    """('done' | 'running' | 'blocked' | 'new', why) for a day whose landing content has ``fingerprint``.

    The runs that already processed this content: the run (and its retries) that made the newest
    ``events`` materialisation with this fingerprint, whoever launched it, and every run the sensor
    requested for it (tagged with it, in case it failed before ``events`` materialised)."""
    runs: list[dg.DagsterRun] = []
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("events"), asset_partitions=[day]), limit=1).records
    if records:
        mat = records[0].asset_materialization
        recorded = mat.metadata.get("landing_fingerprint") if mat else None
        if recorded is not None and recorded.value == fingerprint:
            group = instance.get_run_group(records[0].run_id)
            runs += group[1] if group else []
    runs += instance.get_runs(dg.RunsFilter(tags={"dagster/partition": day, FINGERPRINT_TAG: fingerprint}))
    if any(_completed(r) for r in runs):
        return "done", f"{day} done"
    for r in runs:
        if r.status in NOT_FINISHED_STATUSES or (_retry_pending(r) and not any(c.parent_run_id == r.run_id for c in runs)):
            return "running", f"run {r.run_id[:8]} of {day} is {r.status.value}" + (" (its retry is due)" if _retry_pending(r) else "")
    if runs:
        last = max(runs, key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)
        checks, reason = last.tags.get(BLOCKED_BY_TAG), last.tags.get(BLOCKED_REASON_TAG, "")
        return "blocked", f"run {last.run_id[:8]} ended {last.status.value}" + (f" ({checks}: {reason})" if checks else "")
    if records:
        return "new", f"{day}'s landing content changed since its last run"
    return "new", f"{day} landed"


def _completed(run: dg.DagsterRun) -> bool:
    return run.status == dg.DagsterRunStatus.SUCCESS


def _retry_pending(run: dg.DagsterRun) -> bool:
    return run.status == dg.DagsterRunStatus.FAILURE and run.tags.get("dagster/will_retry") == "true"


def _busy(instance: dg.DagsterInstance) -> str | None:
    """Why nothing may start now: a run in flight, or a failed run whose retry is not launched yet."""
    for run in instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES), limit=1):
        return f"run {run.run_id[:8]} ({run.job_name} {run.tags.get('dagster/partition', '')}) is {run.status.value}: days run one at a time"
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE],
                                                tags={"dagster/will_retry": "true"}), limit=20):
        if not instance.get_runs(dg.RunsFilter(tags={"dagster/parent_run_id": run.run_id}), limit=1):
            return f"run {run.run_id[:8]} failed and its retry is about to be launched"
    return None


@dg.failure_hook(name="mark_blocked_run")
def mark_blocked_run(context: dg.HookContext) -> None:
    """A step stopped by failed blocking checks is a verdict on the data, not a transient fault: tag the
    run with the checks and the reason (what `genrank status`, the sensor and the UI show) and turn its
    run retry off, so the day stays blocked instead of being retried."""
    failed = []
    for record in context.instance.get_records_for_run(
            context.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR and evaluation.blocking:
            failed.append(evaluation)
    if not failed:
        return
    names = ",".join(f"{e.asset_key.to_user_string()}:{e.check_name}" for e in failed)
    context.instance.add_run_tags(context.run_id, {
        BLOCKED_BY_TAG: names,
        BLOCKED_REASON_TAG: (failed[0].description or "")[:500],
        "dagster/retry_on_asset_or_op_failure": "false",
    })
