"""Benchmark of the Spark events job: rows/s, and local[1] vs local[2] measured in the same run.

    .venv/bin/python benchmarks/spark_aggregation.py --preset large --days 3 --home /tmp/genrank-bench-large

Simulates the world into ``--home`` (skipped when a world with the same preset/seed/days is already
there), then runs the events job for a middle day (so D-1 and D+1 are both read) once as a warm-up
and ``--repeats`` times on each master, interleaved, and reports the median. ``--days`` shortens the
preset's day count (the ``large`` preset has 21 days, which takes long to simulate on 2 cores; the
events job of one day only reads D-1, D and D+1, so three days are enough for a per-day figure).
Figures go to stdout and, with ``--write``, to benchmarks/RESULTS.spark.md (a scratch copy; the recorded
figures live in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def ensure_world(home: Path, preset: str, seed: int, days: int | None) -> dict:
    manifest_path = home / "simulator" / "manifest.json"
    if manifest_path.exists():
        m = json.loads(manifest_path.read_text())
        if m.get("preset") == preset and m.get("seed") == seed and (days is None or len(m["days"]) == days):
            print(f"reusing the simulated world in {home}")
            return m, None
    from transforms.simulator import resolve_config, simulate

    overrides = {"n_days": days} if days else {}
    t0 = time.perf_counter()
    report = simulate(preset=preset, seed=seed, out=home, config=resolve_config(preset, **overrides))
    print(report.summary())
    took = time.perf_counter() - t0
    print(f"simulation took {took:.1f} s")
    return json.loads(manifest_path.read_text()), took


def manifest_mismatches(files: dict, result) -> dict:
    """Counters that must equal the simulator's manifest exactly: {name: (manifest, job)} for mismatches."""
    out = {}
    for kind, m in files.items():
        a = result.accounting[kind]
        pairs = {"lines": (m["lines"], a.input_lines),
                 "duplicate_line": (m["duplicate_line"], a.duplicates_by_reason.get("duplicate_line", 0)),
                 "duplicate_impression_id": (m["duplicate_impression_id"], a.duplicates_by_reason.get("duplicate_impression_id", 0)),
                 "orphan_click": (m["orphan_click"], a.quarantined_by_reason.get("orphan_click", 0))}
        for r in ("malformed_json", "missing_key", "bad_type"):
            pairs[r] = (m[r], a.quarantined_by_reason.get(r, 0))
        out.update({f"{kind}/{k}": v for k, v in pairs.items() if v[0] != v[1]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=3, help="override the preset's number of days (0: keep)")
    ap.add_argument("--home", default=None, help="data root for the world (default /tmp/genrank-bench-<preset>)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--no-verify", action="store_true", help="skip the Python gzip/line-count pre-check of landing files")
    ap.add_argument("--write", action="store_true", help="write the figures to benchmarks/RESULTS.spark.md")
    args = ap.parse_args(argv)

    from transforms.spark.events import run_events_job
    from transforms.spark.session import build_session

    home = Path(args.home or f"/tmp/genrank-bench-{args.preset}")
    manifest, sim_s = ensure_world(home, args.preset, args.seed, args.days or None)
    days = manifest["days"]
    day = days[len(days) // 2] if len(days) >= 3 else days[0]
    lines_d = sum(v["lines"] for v in manifest["files"][day].values())
    masters = [m.strip() for m in args.masters.split(",")]

    def run(master: str):
        spark = build_session(master=master, driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions,
                              app_name="genrank-bench")
        return run_events_job(spark, home, day, verify_landing=not args.no_verify)

    print(f"day {day}: {lines_d:,} input lines in D's files; warm-up on {masters[-1]} ...")
    warm = run(masters[-1])
    print(warm.summary())
    mismatch = manifest_mismatches(manifest["files"][day], warm)
    print("quarantine/duplicate counts vs the simulator manifest:", "exact match" if not mismatch else mismatch)
    times: dict[str, list[float]] = {m: [] for m in masters}
    for rep in range(args.repeats):
        for m in masters:
            r = run(m)
            times[m].append(r.duration_s)
            print(f"  {m} run {rep + 1}: {r.duration_s:.2f} s, {r.rows_per_s:,.0f} lines/s")
    med = {m: statistics.median(v) for m, v in times.items()}
    ratio = med[masters[0]] / med[masters[-1]] if len(masters) > 1 else 1.0
    load = os.getloadavg()
    print("\nresults")
    for m in masters:
        print(f"  {m:10s} median {med[m]:.2f} s  -> {lines_d / med[m]:,.0f} lines/s of day D "
              f"({warm.lines_read / med[m]:,.0f} lines/s incl. D-1/D+1 context)")
    if len(masters) > 1:
        print(f"  speed-up {masters[-1]} vs {masters[0]}: x{ratio:.2f} (time {masters[0]} / time {masters[-1]})")

    if args.write:
        cmd = " ".join([".venv/bin/python benchmarks/spark_aggregation.py", *[shlex.quote(a) for a in (argv or sys.argv[1:])]])
        sim_note = (f"simulated by this run in {sim_s:.0f} s" if sim_s is not None
                    else "simulated by an earlier run of this script (3 days of `large`: about 4 min here) and reused")
        out = REPO / "benchmarks" / "RESULTS.spark.md"
        rows = "\n".join(
            f"| `{m}` | {med[m]:.2f} | {', '.join(f'{t:.2f}' for t in times[m])} | {lines_d / med[m]:,.0f} | {warm.lines_read / med[m]:,.0f} |"
            for m in masters)
        acc = warm.accounting
        text = f"""# Spark events job benchmark

Command (from the repository root):

    {cmd}

World: preset `{manifest['preset']}`, seed {manifest['seed']}, {len(days)} simulated day(s) ({days[0]} .. {days[-1]}),
{sim_note}. The full `large` preset has 21 days; one job reads only D-1, D and D+1, so 3 days give the
per-day figure at a fraction of the simulation time.
Measured day: **{day}** — {lines_d:,} input lines in D's files (impressions {acc['impressions'].input_lines:,}, clicks
{acc['clicks'].input_lines:,}, behaviors {acc['behaviors'].input_lines:,}); with D-1's impressions+clicks and D+1's clicks the
job reads {warm.lines_read:,} lines. Output: {warm.events_rows:,} events ({warm.impressions:,} impressions, CTR
{(warm.ctr or 0):.4f}), {warm.quarantined:,} quarantined, {warm.duplicates:,} duplicates. Landing pre-check (Python gzip
decompression + line counts of the three days) {'off' if args.no_verify else 'on, included in the times'}.
Quarantine and duplicate counts of the measured day vs the simulator manifest: {'exact match' if not mismatch else mismatch}.

One warm-up run, then {args.repeats} interleaved run(s) per master; the median is reported. A run is the whole
job entry `run_events_job`: landing validation, read, parse, dedup, attribution, counts, two atomic Parquet writes.

| master | median s | runs s | lines/s (day D) | lines/s (all lines read) |
|---|---|---|---|---|
{rows}

**local[2] vs local[1]: x{ratio:.2f}** (time local[1] / time local[2], same process, same JVM).

Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), shared with other work: load average
{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) at the end of the run, so the ratio understates what two free
cores give. spark.driver.memory={args.driver_memory}, spark.sql.shuffle.partitions={args.shuffle_partitions}, AQE on.
"""
        out.write_text(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
