"""The teacher's retrain as users launch it (`teacher_job`, on demand), timed on a simulated world.

    python benchmarks/teacher_retrain.py --preset large --days 8 --home /tmp/genrank-bench-teacher

1. simulates the preset's first ``--days`` days into ``--home`` (kept: a rerun reuses them) and builds their
   training samples through the pipeline's own ingest and sequences stages (benchmarks/quality_suite/samples);
2. runs the pipeline's ``teacher_job`` (the asset ``teacher_model``, forced, the default recipe) twice in a child
   process each: over the trailing 2 days of samples, which is what a daily run's first teacher trains on, as
   the baseline of this run; then over the trailing ``--window`` days (7: the weekly retrain);
3. prints each one's wall (the child process: imports and the MLflow registration included), the asset's own
   training seconds, its steps (the recipe's ``max_steps`` caps them), tokens/s, the peak resident memory of
   the child's process tree (pipelines.stage_profile, as the run report samples it), and the retrain's wall
   over the baseline's.

Target (issue #35 item 3): the teacher's retrain on 7 days of the `large` world in at most 15 minutes on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT_TAG = "TEACHER_RETRAIN "


def ensure_samples(home: Path, preset: str, seed: int, days: int) -> list[str]:
    from benchmarks.quality_suite.samples import build_training_samples, sample_days
    from transforms import landing
    from transforms.simulator import resolve_config, simulate

    if not landing.complete_days(home):
        home.mkdir(parents=True, exist_ok=True)
        print(simulate(preset=preset, seed=seed, out=home, config=resolve_config(preset, n_days=days)).summary(), flush=True)
    build_training_samples(home)
    return sample_days(home)


def retrain(home: Path, window: int) -> dict:
    """One forced teacher_job over the trailing ``window`` days, in a child process; its figures."""
    from pipelines.stage_profile import PeakByStep
    from transforms import landing

    env = {**os.environ, "GENRANK_HOME": str(home), "GENRANK_START_DATE": landing.complete_days(home)[0]}
    env.pop("DAGSTER_HOME", None)
    log = home / f"teacher-retrain-{window}d.log"
    started = time.perf_counter()
    with open(log, "w") as sink:
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", str(home), "--window", str(window)],
                                 env=env, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=str(REPO))
        with PeakByStep(lambda: "teacher_job", root=child.pid) as peak:
            output = child.communicate()[0]
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"teacher_job over {window} days failed (exit {child.returncode}); see {log}")
    figures = json.loads(next(line for line in output.splitlines() if line.startswith(RESULT_TAG))[len(RESULT_TAG):])
    return {**figures, "wall_s": wall, "peak_tree_rss_mib": peak.peaks.get("teacher_job", 0) / 2**20}


def _child(home: Path, window: int) -> int:
    from pipelines.runner import prepare_instance

    instance = prepare_instance(home)
    from pipelines.definitions import defs

    job = defs.resolve_job_def("teacher_job")
    run_config = {"ops": {"teacher_model": {"config": {"window_days": window, "force": True}}},
                  "loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    result = job.execute_in_process(instance=instance, run_config=run_config,
                                    tags={"genrank/launched_by": "benchmarks/teacher_retrain.py"})
    if not result.success:
        return 1
    [materialization] = result.asset_materializations_for_node("teacher_model")
    meta = {k: v.value for k, v in materialization.metadata.items()}
    keep = ("version", "window", "train_seconds", "steps", "tokens_per_s")
    print(RESULT_TAG + json.dumps({k: meta[k] for k in keep}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=8, help="days of the preset to simulate (the window plus one)")
    ap.add_argument("--window", type=int, default=7, help="the retrain's trailing days (the weekly retrain's 7)")
    ap.add_argument("--home", default=None, help="data root (default /tmp/genrank-bench-teacher-<preset>)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(Path(args.child), args.window)

    home = Path(args.home or f"/tmp/genrank-bench-teacher-{args.preset}")
    days = ensure_samples(home, args.preset, args.seed, args.days)
    if len(days) < args.window:
        raise SystemExit(f"{len(days)} days of samples in {home}: the retrain needs {args.window} (raise --days)")
    runs = [(2, retrain(home, 2)), (args.window, retrain(home, args.window))]
    base = runs[0][1]["wall_s"]
    print(f"\n{args.preset} world, samples {days[0]}..{days[-1]}; teacher_job (forced), the default recipe\n")
    print("| window | days trained | wall s | train s | steps | tokens/s | peak RSS (tree) | wall / 2-day |")
    print("|---|---|---|---|---|---|---|---|")
    for window, r in runs:
        print(f"| {window} days | {r['window']} | {r['wall_s']:.1f} | {r['train_seconds']:.1f} | {r['steps']} | "
              f"{r['tokens_per_s']:,.0f} | {r['peak_tree_rss_mib']:,.0f} MiB | x{r['wall_s'] / base:.2f} |")
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
