"""Incremental sequence build vs full rebuild, per day, on a simulated world.

    python benchmarks/sequence_build.py --preset large --workdir /tmp/genrank-bench

1. simulates the world and runs the Spark events job for every day (cached in --workdir);
2. builds user_sequences + training_samples incrementally, one dbt invocation per day, and records
   each day's time (whole invocation, and the `user_sequences` model alone from dbt's run_results);
3. for k in a few days, rebuilds days 1..k from scratch in one invocation, and records that time.
The incremental cost per day should stay flat (day N / day 1 close to 1) while the full rebuild
grows with k. Prints a markdown table; ratios are measured within this run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transforms import landing, sequences  # noqa: E402


def prepare_lake(workdir: Path, preset: str, seed: int, days: int | None) -> list[str]:
    from transforms.simulator import resolve_config, simulate

    marker = workdir / f".lake-{preset}-{seed}-{days}"
    if not marker.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        config = resolve_config(preset, n_days=days) if days else None
        print(simulate(preset=preset, seed=seed, out=workdir, config=config).summary(), flush=True)
        from transforms.spark.events import run_events_job
        from transforms.spark.session import build_session

        spark = build_session(master="local[2]", driver_memory="4g", shuffle_partitions=4)
        for day in landing.complete_days(workdir):
            t = time.perf_counter()
            r = run_events_job(spark, workdir, day)
            print(f"events {day}: {r.events_rows:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
        spark.stop()
        marker.touch()
    return landing.complete_days(workdir)


def dbt_build(home: Path, start: str, end: str, select: str) -> tuple[float, float]:
    """(wall seconds of the invocation, seconds of the user_sequences model)."""
    env = {**os.environ, "GENRANK_HOME": str(home), "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}
    target = home / "dbt-target"
    t = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("dbt")), "run", "--project-dir", str(sequences.DBT_PROJECT_DIR),
                    "--profiles-dir", str(sequences.DBT_PROJECT_DIR), "--target-path", str(target),
                    "--select", select, "--vars", json.dumps({"start_date": start, "end_date": end})],
                   check=True, env=env, capture_output=True)
    wall = time.perf_counter() - t
    results = json.loads((target / "run_results.json").read_text())["results"]
    model = next(r["execution_time"] for r in results if r["unique_id"].endswith(".user_sequences"))
    return wall, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=None, help="simulate only the first N days of the preset")
    ap.add_argument("--workdir", default="/tmp/genrank-bench-sequences")
    ap.add_argument("--select", default="stg_events user_sequences",
                    help="dbt models to build (training_samples grows with history by design; add it to see)")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    days = prepare_lake(workdir, args.preset, args.seed, args.days)
    n = len(days)

    inc_home = workdir / "incremental"
    shutil.rmtree(inc_home, ignore_errors=True)
    inc_home.mkdir()
    (inc_home / "lake").symlink_to(workdir / "lake")
    incremental = []
    for day in days:
        incremental.append(dbt_build(inc_home, day, day, args.select))

    checkpoints = sorted({1, max(1, n // 4), max(1, n // 2), max(1, 3 * n // 4), n})
    full = {}
    for k in checkpoints:
        home = workdir / f"full-{k}"
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        (home / "lake").symlink_to(workdir / "lake")
        full[k] = dbt_build(home, days[0], days[k - 1], args.select)

    print(f"\n{args.preset} world, {n} days; dbt models: {args.select}\n")
    print("| day k | incremental day k: invocation s | user_sequences s | full rebuild 1..k: invocation s | user_sequences s |")
    print("|---|---|---|---|---|")
    for k in range(1, n + 1):
        w, m = incremental[k - 1]
        fw, fm = full.get(k, (None, None))
        full_cells = f"{fw:.2f} | {fm:.3f}" if fw is not None else "- | -"
        print(f"| {k} | {w:.2f} | {m:.3f} | {full_cells} |")
    first_n = max(1, min(3, n // 3))
    head = sum(m for _, m in incremental[:first_n]) / first_n
    tail = sum(m for _, m in incremental[-first_n:]) / first_n
    print(f"\nincremental user_sequences, mean of the last {first_n} days / first {first_n} days: {tail / head:.2f}")
    print(f"full rebuild user_sequences, 1..{n} / 1..1: {full[n][1] / full[1][1]:.2f}")


if __name__ == "__main__":
    main()
