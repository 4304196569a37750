"""Run the daily job over landed days from the command line, recording runs in the Dagster instance.

This is what ``genrank run`` / ``genrank demo`` (README command 1) call: the same job the schedule and
sensor launch, executed in process one partition after another, in order, so that each day sees the
state its predecessor left (warm-starts, incremental sequences). The runs land in
``$GENRANK_HOME/dagster_home`` and show in ``dagster dev`` afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from assets import partitions
from contracts import settings
from pipelines.console import RunConsole
from pipelines.report import stages_line, write_run_report
from pipelines.stage_profile import PeakByStep, step_seconds
from transforms import landing

# Written by genrank: this line marks a file the project may update (delete the line to keep edits).
INSTANCE_MARKER = "# genrank local instance (pipelines/runner.py INSTANCE_YAML)"
# - nux: no "join the community" modal over the UI's pages.
# - concurrency.runs (the run queue): one run at a time (2 cores; the daily state of D depends on D-1), dequeued in creation
#   order, so a daily_job backfill from the UI runs its days in date order; the lane limit is the rule
#   deploy/dagster.yaml keeps with more concurrent runs.
# - concurrency pools: one training step and one warehouse writer at a time across runs.
# - run_retries: must be enabled on an open-source instance for daily_job's dagster/max_retries tag to
#   act (one retry from the failed step); the default count stays 0 for every other job.
INSTANCE_YAML = f"""\
{INSTANCE_MARKER}
telemetry:
  enabled: false
nux:
  enabled: false
concurrency:
  runs:
    max_concurrent_runs: 1
    tag_concurrency_limits:
      - key: genrank/lane
        value: daily
        limit: 1
  pools:
    granularity: op
    default_limit: 1
run_retries:
  enabled: true
  max_retries: 0
"""


def local_dagster_home(home: Path) -> Path:
    """$GENRANK_HOME/dagster_home with the project's instance config (written when missing or when it
    is an older version of the project's own file)."""
    dagster_home = Path(home) / "dagster_home"
    dagster_home.mkdir(parents=True, exist_ok=True)
    cfg = dagster_home / "dagster.yaml"
    if not cfg.exists() or (cfg.read_text().startswith(INSTANCE_MARKER) and cfg.read_text() != INSTANCE_YAML):
        cfg.write_text(INSTANCE_YAML)
    return dagster_home


def prepare_code_location(home: Path) -> None:
    """What the code location needs before it loads, prepared by the command so that every process it starts
    agrees: GENRANK_START_DATE pinned (assets.partitions.pin_start_date), the landed days checked against
    the partition set that pins (a one-line ValueError, before anything is written), and dbt's manifest
    parsed when missing or stale."""
    from transforms.sequences import ensure_manifest

    partitions.pin_start_date(home)
    partitions.check_days_in_partitions(landing.complete_days(home))
    ensure_manifest()


def prepare_instance(home: Path):
    """The persistent Dagster instance under GENRANK_HOME (unless DAGSTER_HOME is set)."""
    import dagster as dg

    if not settings.dagster_home():
        os.environ["DAGSTER_HOME"] = str(local_dagster_home(home))
    return dg.DagsterInstance.get()


@dataclass
class DayResult:
    day: str
    success: bool
    figures: dict[str, object] = field(default_factory=dict)
    failed_checks: list[str] = field(default_factory=list)
    error: str | None = None
    monitor: dict[str, object] = field(default_factory=dict)   # serving_monitor's figures, for the report's plot
    # step -> (wall seconds, peak RSS bytes of the run's process tree while it ran, None when not sampled)
    stages: dict[str, tuple[float, int | None]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if not self.success or self.failed_checks:
            return "FAILED"
        return "refused" if self.figures.get("decision") == "refused" else "ok"


@dataclass
class RunSummary:
    days: list[DayResult]

    @property
    def ok(self) -> bool:
        """Every day ran (its teacher retrain included); a challenger refused by a gate is a decision
        inside a successful run, not a failure."""
        return bool(self.days) and all(d.success for d in self.days)


# Metadata keys worth a column in the printed per-day summary: (asset, key) -> label.
SUMMARY_KEYS: dict[tuple[str, str], str] = {
    ("events", "impressions"): "impressions",
    ("events", "ctr"): "ctr",
    ("events", "quarantined"): "quarantined",
    ("events", "duplicates"): "duplicates",
    ("training_samples", "samples"): "samples",
    ("training_samples", "history_len_mean"): "hist_mean",
    ("training_samples", "history_len_p50"): "hist_p50",
    ("training_samples", "history_len_p90"): "hist_p90",
    ("training_samples", "history_len_max"): "hist_max",
    ("teacher_logits", "auc"): "teacher_auc",
    ("student_candidate", "kd"): "kd",
    ("challenger_evaluation", "challenger_auc"): "student_auc",
    ("challenger_evaluation", "reference_auc"): "reference_auc",
    ("challenger_evaluation", "compared_with"): "vs",
    ("challenger_evaluation", "decision"): "decision",
    ("challenger_evaluation", "reasons"): "why",
    ("promotion", "champion_version"): "champion",
}
# serving_monitor's metadata the report plots per day (pipelines/report.py MONITOR_PANELS), not printed
MONITOR_KEYS = ("served", "skew_max_abs_diff", "psi", "calibration_by_bucket")
TEACHER_EVERY_DAYS = 7    # the teacher's retrain cadence (assets/training.py TeacherTrainingConfig.every_days)


def run_days(start: str | None, end: str | None, home: Path | None = None,
             teacher_every_days: int = TEACHER_EVERY_DAYS, verbose: bool = False) -> RunSummary:
    """Every complete landing day in [start, end] through the daily job, in order. The teacher retrains
    inside the run of the day that first needs it (two days of samples before it, then every
    ``teacher_every_days`` days), exactly as under the daemon. The console shows a live line per day and
    its summary row; the libraries' logs go to $GENRANK_HOME/logs/ (and to the console with ``verbose``)."""
    home = home or settings.genrank_home()
    days = [d for d in landing.complete_days(home) if (start is None or d >= start) and (end is None or d <= end)]
    if not days:
        raise ValueError(f"no complete landing day under {home / 'landing'} in [{start or '-'}, {end or '-'}]: "
                         "run `genrank simulate` or `genrank import` first")
    # what prepare_code_location does, the check before the console so that a mismatch writes nothing
    partitions.pin_start_date(home)
    partitions.check_days_in_partitions(days)
    with RunConsole(home, verbose) as console:
        from transforms.sequences import ensure_manifest

        ensure_manifest()   # dbt's parse output goes to the run's log
        from pipelines.definitions import defs

        daily = defs.resolve_job_def("daily_job")
        # a process that loaded the code location for another data root earlier keeps that partition set
        partitions.check_days_in_partitions(days, daily.partitions_def)
        instance = prepare_instance(home)
        run_config = {"loggers": {"console": {"config": {"log_level": "INFO" if verbose else "WARNING"}}},
                      "ops": {"teacher_model": {"config": {"every_days": teacher_every_days}}}}
        oracle = _oracle_auc_by_day(home)
        results = []
        from dagster._core.utils import make_new_run_id

        for i, day in enumerate(days, 1):
            run_id = make_new_run_id()
            with console.progress(f"day {i}/{len(days)} {day}", _current_step_reader(run_id)), \
                    PeakByStep(_current_step_reader(run_id)) as peaks:
                result = daily.execute_in_process(
                    partition_key=day, instance=instance, raise_on_error=False, run_config=run_config, run_id=run_id,
                    # the command reports a failed day itself: no daemon retries it later
                    tags={"genrank/launched_by": "cli", "dagster/max_retries": "0"})
            teacher = _materialization_metadata(result, "teacher_model")
            if "window" in teacher:
                console.print(f"{day}  teacher {'retrained' if teacher.get('retrained') else 'reused'} before the day: "
                              f"version {teacher.get('version')}, trained on {teacher.get('window')}"
                              + (f" ({teacher['steps']} steps)" if "steps" in teacher else ""))
            results.append(_summarise(day, result))
            results[-1].stages = {step: (seconds, peaks.peaks.get(step))
                                  for step, seconds in step_seconds(instance, run_id).items()}
            if day in oracle:
                results[-1].figures["oracle_auc"] = oracle[day]
            console.print(_format_day(results[-1]))
        summary = RunSummary(results)
        refused = sum(r.status == "refused" for r in results)
        console.print(f"\n{sum(r.success for r in results)}/{len(results)} days ran"
                      + (f" ({refused} challenger(s) refused by the gates: a decision, not a failure)." if refused else "."))
        champion = _champion_line(home, results)
        console.print(champion)
        console.print(stages_line(results))
        try:
            stamp = console.log_path.stem.removeprefix("run-")
            console.print(f"Report: {write_run_report(home / 'reports', stamp, results, champion, settings.tracking_uri(home))}")
        except Exception as exc:  # an unwritable folder, an unreachable tracking server: the run itself is done
            console.print(f"warning: no run report ({type(exc).__name__}: {exc})")
        console.print(f"Dagster: DAGSTER_HOME={settings.dagster_home()} .venv/bin/genrank ui  (http://localhost:3000)")
        console.print(f"MLflow:  mlflow ui --backend-store-uri sqlite:///{home / 'mlflow.db'}  (http://localhost:5000)")
    return summary


def _current_step_reader(run_id: str):
    """A function giving the step the run is executing (its newest STEP_START), for the progress line.
    It reads through an instance of its own: the progress thread must not share the run's connections."""
    import dagster as dg

    reader = {}

    def current() -> str | None:
        if "instance" not in reader:
            reader["instance"] = dg.DagsterInstance.from_config(settings.dagster_home())
        records = reader["instance"].get_records_for_run(
            run_id, of_type=dg.DagsterEventType.STEP_START, ascending=False, limit=1).records
        return records[0].event_log_entry.step_key if records else None

    return current


def _champion_line(home: Path, results: list[DayResult]) -> str:
    from deploy import registry

    champion = registry.default_registry(home).by_alias(registry.CTR, "champion")
    if champion is None:
        return "No champion: " + _why_no_champion(results)
    return (f"Champion: {registry.CTR} v{champion.version} (trained on {champion.tags.get('partition')}, "
            f"{_distilled_from(champion.tags)}, out-of-time AUC {champion.tags.get('oot_auc', '?')}); "
            f"models:/{registry.CTR}@champion")


def _distilled_from(tags: dict) -> str:
    teacher = tags.get("teacher_version", "none")
    return "no KD (the teacher gate refused)" if teacher == "none" else f"teacher v{teacher}"


def _why_no_champion(results: list[DayResult]) -> str:
    """One line: the newest judgement's reason, or why no challenger was judged."""
    judged = [r for r in results if "decision" in r.figures]
    if judged:
        last = judged[-1]
        return (f"{len(judged)} challenger(s) judged, none promoted; the newest, on {last.day}: "
                f"{last.figures.get('why', 'no reason recorded')}.")
    failed = [r for r in results if not r.success]
    if failed:
        return f"{failed[0].day} failed ({failed[0].error or ', '.join(failed[0].failed_checks)}), so no challenger was judged."
    return (f"no challenger was judged in these {len(results)} day(s): a candidate trains from the first day a "
            "teacher serves (two days of samples before it) and is judged on the day after.")


def _oracle_auc_by_day(home: Path) -> dict[str, float]:
    """The simulator's best achievable AUC per day (serving visibility), when the data is simulated."""
    folder = home / "simulator" / "oracle"
    if not folder.is_dir():
        return {}
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    out = {}
    for part in sorted(folder.glob("date=*/oracle.parquet")):
        df = pd.read_parquet(part, columns=["p_click_serving", "clicked", "logged"])
        df = df[df["logged"]]
        if df["clicked"].nunique() == 2:
            out[part.parent.name.removeprefix("date=")] = float(roc_auc_score(df["clicked"], df["p_click_serving"]))
    return out


def _materialization_metadata(result, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            return {k: v.value for k, v in mat.metadata.items()}
    return {}


def _summarise(day: str, result) -> DayResult:
    figures: dict[str, object] = {}
    monitor: dict[str, object] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        asset = mat.asset_key.to_user_string()
        for key, value in mat.metadata.items():
            if (asset, key) in SUMMARY_KEYS:
                figures[SUMMARY_KEYS[asset, key]] = value.value
            elif asset == "serving_monitor" and key in MONITOR_KEYS:
                monitor[key] = value.value
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
    return DayResult(day, result.success, figures, failed, error, monitor)


def _format_day(r: DayResult) -> str:
    parts = [f"{r.day}  {r.status:6s}"]
    parts += [f"{k}={_fmt(v)}" for k, v in r.figures.items()]
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
