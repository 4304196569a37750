"""The end-of-run report of `genrank run`: a Markdown table per day and the champion in
``$GENRANK_HOME/reports/run-<timestamp>.md``, beside a PNG of the AUC per day against the oracle; both
logged to MLflow (experiment ``genrank-runs``) and linked from the report. A report that cannot be
written is a warning, never a failed run."""

from __future__ import annotations

import math
from pathlib import Path

# (figure key in DayResult.figures, column title)
COLUMNS = (
    ("impressions", "impressions"), ("quarantined", "quarantined"), ("duplicates", "duplicates"),
    ("hist_mean", "history mean"), ("hist_p90", "history p90"), ("teacher_auc", "teacher AUC"), ("kd", "student's KD"),
    ("student_auc", "challenger AUC"), ("reference_auc", "reference AUC"), ("vs", "reference"),
    ("oracle_auc", "oracle AUC"), ("decision", "decision"), ("why", "why"),
)
CURVES = (("oracle_auc", "oracle (serving visibility)"), ("teacher_auc", "teacher"),
          ("student_auc", "challenger"), ("reference_auc", "reference"))


def write_run_report(folder: Path, stamp: str, days: list, champion: str, tracking_uri: str) -> Path:
    """The report's path; raises OSError when the folder cannot be written (the caller warns)."""
    folder.mkdir(parents=True, exist_ok=True)
    plot, monitoring = folder / f"run-{stamp}-auc.png", folder / f"run-{stamp}-monitoring.png"
    _auc_plot(days, plot)
    _monitoring_plot(days, monitoring)
    run_id = _log_to_mlflow(tracking_uri, stamp, plot)
    lines = [f"# genrank run {stamp}", "", f"**{champion}**", "",
             "| day | status | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for d in days:
        cells = [_cell(d.figures.get(key)) for key, _ in COLUMNS]
        lines.append(f"| {d.day} | {d.status} | " + " | ".join(cells) + " |")
        if d.error and d.status == "FAILED":
            lines.append(f"| | error | {d.error.replace('|', '/')[:300]} |" + " |" * (len(COLUMNS) - 1))
    lines += stage_tables(days)
    lines += ["", f"![AUC per day against the oracle]({plot.name})", "",
              f"![Serving monitor per day: skew, drift, live calibration]({monitoring.name})", "",
              f"MLflow: experiment `genrank-runs`, run `{run_id}` ({tracking_uri})" if run_id else ""]
    report = folder / f"run-{stamp}.md"
    report.write_text("\n".join(lines) + "\n")
    if run_id:
        _log_artifact(tracking_uri, run_id, monitoring)
        _log_artifact(tracking_uri, run_id, report)
    return report


def _stage_totals(days: list) -> dict[str, tuple[float, int | None]]:
    """Each stage over the days: (total seconds, largest peak RSS in bytes or None), slowest first."""
    totals: dict[str, tuple[float, int | None]] = {}
    for d in days:
        for step, (seconds, peak) in d.stages.items():
            total, largest = totals.get(step, (0.0, None))
            totals[step] = (total + seconds, max(filter(None, (largest, peak)), default=None))
    return dict(sorted(totals.items(), key=lambda kv: -kv[1][0]))


def stage_tables(days: list) -> list[str]:
    """Markdown: each stage's wall seconds per day and in all, then the run process tree's peak RSS while it ran
    (pipelines/stage_profile.py; what earlier stages left resident counts too)."""
    totals = _stage_totals(days)
    if not totals:
        return []
    mib = lambda b: "-" if b is None else f"{b / 2**20:,.0f}"   # noqa: E731
    head = "| stage | " + " | ".join(d.day for d in days)
    rule = "|---|" + "---|" * len(days)
    lines = ["", "## Where the time goes", "", "Wall seconds per stage and day (Dagster's step times):", "",
             head + " | all days |", rule + "---|"]
    for step, (total, _) in totals.items():
        cells = [f"{d.stages[step][0]:.1f}" if step in d.stages else "-" for d in days]
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {total:.1f} |")
    lines.append("| **day** | " + " | ".join(f"{sum(s for s, _ in d.stages.values()):.1f}" for d in days)
                 + f" | {sum(t for t, _ in totals.values()):.1f} |")
    lines += ["", "Peak resident memory (MiB) of the run's process tree while each stage ran (Python, the Spark "
              "driver, dbt, torchrun's workers; sampled every 0.5 s, '-' for a stage shorter than that):", "",
              head + " | largest |", rule + "---|"]
    for step, (_, largest) in totals.items():
        lines.append(f"| {step} | " + " | ".join(mib(d.stages[step][1]) if step in d.stages else "-" for d in days)
                     + f" | {mib(largest)} |")
    return lines


def stages_line(days: list) -> str:
    """One console line: the slowest stages over the run and the largest peak."""
    totals = _stage_totals(days)
    if not totals:
        return "Time by stage: none recorded."
    slowest = ", ".join(f"{step} {total:.0f} s" for step, (total, _) in list(totals.items())[:4])
    peaks = [(peak, step) for step, (_, peak) in totals.items() if peak is not None]
    peak = f"; peak RSS {max(peaks)[0] / 2**30:.1f} GiB ({max(peaks)[1]})" if peaks else ""
    return (f"Time by stage: {slowest} (of {sum(t for t, _ in totals.values()):.0f} s in steps){peak}; "
            "the report has every stage per day.")


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "/")


def _auc_plot(days: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = [d.day for d in days]
    for key, label in CURVES:
        y = [d.figures.get(key) if isinstance(d.figures.get(key), float) else float("nan") for d in days]
        if any(not math.isnan(v) for v in y):
            ax.plot(x, y, marker="o", label=label)
    ax.set_ylabel("AUC (out of time)")
    ax.set_title("AUC per day")
    ax.tick_params(axis="x", rotation=45)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def monitoring_series(days: list) -> dict[str, list[float]]:
    """serving_monitor per day, one series per check: ``skew`` (max |served - offline|) and ``bucket K``
    (live predicted / observed CTR) on days the service logged, nan otherwise; ``psi``, the largest PSI of
    any input or of the predictions (the landing inputs are measured on every day)."""
    def served(day, value) -> float:
        return float(value) if day.monitor.get("served") and isinstance(value, (int, float)) else float("nan")

    def largest(table) -> float:
        values = [row["psi"] for row in (table or {}).values() if isinstance(row.get("psi"), (int, float))]
        return max(values) if values else float("nan")

    series = {"skew": [served(d, d.monitor.get("skew_max_abs_diff")) for d in days],
              "psi": [largest(d.monitor.get("psi")) for d in days]}
    rows = {d.day: {row["bucket"]: row.get("calibration") for row in d.monitor.get("calibration_by_bucket") or []}
            for d in days}
    for b in sorted({b for by_bucket in rows.values() for b in by_bucket}):
        series[f"bucket {b}"] = [served(d, rows[d.day].get(b)) for d in days]
    return series


def _monitoring_plot(days: list, path: Path) -> None:
    """The three checks of serving_monitor per day, one panel each (gaps: not served), PSI with its 0.1 / 0.25
    thresholds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, series = [d.day for d in days], monitoring_series(days)
    fig, (skew, drift, calibration) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    skew.plot(x, series.pop("skew"), marker="o")
    skew.set_ylabel("skew: max |diff|")
    drift.plot(x, series.pop("psi"), marker="o")
    for level, style in ((0.1, ":"), (0.25, "--")):
        drift.axhline(level, color="grey", linestyle=style, linewidth=1)
    drift.set_ylabel("drift: largest PSI")
    for label, ratio in series.items():
        calibration.plot(x, ratio, marker="o", label=label)
    calibration.axhline(1.0, color="grey", linewidth=1)
    calibration.set_ylabel("live predicted / observed")
    if series:
        calibration.legend(loc="best")
    calibration.tick_params(axis="x", rotation=45)
    for ax in (skew, drift, calibration):
        ax.grid(alpha=0.3)
    fig.suptitle("serving_monitor per day (gaps: not served)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _log_to_mlflow(tracking_uri: str, stamp: str, plot: Path) -> str | None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("genrank-runs")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("genrank-runs")
    run = client.create_run(experiment_id, run_name=f"run-{stamp}")
    client.log_artifact(run.info.run_id, str(plot))
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def _log_artifact(tracking_uri: str, run_id: str, path: Path) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri).log_artifact(run_id, str(path))
