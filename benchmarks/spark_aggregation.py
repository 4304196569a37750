"""Benchmark of the Spark events job against the machine's parsing limit, measured in the same run.

    .venv/bin/python benchmarks/spark_aggregation.py --preset large --days 9 --home /tmp/genrank-bench-large

Simulates the world into ``--home`` (skipped when a world with the same preset/seed/days is already
there), then, on ``--master`` (default local[2]) with the default driver memory:

1. the whole events job (``run_events_job``: landing checks, read, parse, dedupe, attribution, counts
   against ``_SUCCESS``, both atomic writes) for a middle day D, once to warm up, then ``--repeats``
   times: input lines of D per second (median);
2. (a) the same day through DuckDB's ``read_json`` into the same event table (lenient: malformed lines
   dropped, no quarantine table), and (b) a one-core ``gzip`` + ``orjson`` parse of D's files, the
   practical parsing limit, and (c, d) Spark's own floor on the same master: D's files read as text and
   counted, and D's lines parsed by ``from_json`` into a map (the job's first step, none of its rules);
   each printed as a ratio to the job;
3. the job over 1, 3 and 7 consecutive days: seconds per day stays flat when the growth is linear;
4. the peak RSS of the Spark driver JVM (VmHWM) and of this Python process;
5. the driver JVM's CPU seconds for the job and for both floors: on a shared machine the wall times
   depend on what else runs, the CPU seconds much less (on local[*] the driver JVM does all the work).

Figures go to stdout and, with ``--write``, to benchmarks/RESULTS.spark.md (a scratch copy; the recorded
figures live in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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


def gzip_orjson_lines_per_s(files: list[Path]) -> tuple[int, float]:
    """One core: decompress and parse every line of the files (records; blank and broken lines skipped)."""
    import gzip

    import orjson

    t0 = time.perf_counter()
    n = 0
    for f in files:
        with gzip.open(f, "rb") as fh:
            for line in fh:
                try:
                    orjson.loads(line)
                    n += 1
                except orjson.JSONDecodeError:
                    pass
    return n, time.perf_counter() - t0


def duckdb_same_output(home: Path, day: str, out: Path, threads: int) -> float:
    """The day through DuckDB's read_json into the same event table: seconds (lenient rules, see docstring)."""
    import duckdb

    from contracts import DAY_MS
    from transforms.landing import day_start_ms
    from transforms.spark.events import EVENT_COLUMNS

    def files(d: str, kind: str) -> str:
        return f"'{home}/landing/date={d}/{kind}-*.jsonl.gz'"

    start = day_start_ms(day)
    nxt = dt.date.fromisoformat(day) + dt.timedelta(days=1)
    clicks = " union all ".join(f"select * from read_json({files(d, 'clicks')}, format='newline_delimited', "
                                "ignore_errors=true, columns={impression_id:'varchar', ts_ms:'bigint', click_type:'varchar', dwell_ms:'bigint'})"
                                for d in (day, nxt.isoformat()) if (home / "landing" / f"date={d}").exists())
    cols = ", ".join(f"cast({c} as {'varchar' if t == 'string' else t}) as {c}" for c, t in EVENT_COLUMNS.items())
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute(f"set threads = {threads}")
    con.execute(f"""
        copy (
        with imps as (
            select * from read_json({files(day, 'impressions')}, format='newline_delimited', ignore_errors=true,
                 columns={{request_id:'varchar', impression_id:'varchar', user_id:'varchar', ts_ms:'bigint', ad_id:'varchar',
                          campaign_id:'varchar', advertiser_id:'varchar', category_id:'varchar', brand_id:'varchar',
                          position:'integer', surface:'varchar', device:'varchar'}})
            where impression_id is not null and ts_ms between {start} and {start + DAY_MS - 1}
            qualify row_number() over (partition by impression_id order by ts_ms) = 1),
        clicks as ({clicks}),
        winners as (
            select c.impression_id, c.click_type, c.dwell_ms, c.ts_ms as click_ts_ms
            from clicks c join imps i on c.impression_id = i.impression_id
                 and c.ts_ms between i.ts_ms and i.ts_ms + 3600000
            qualify row_number() over (partition by c.impression_id order by c.ts_ms) = 1),
        beh as (
            select distinct * from read_json({files(day, 'behaviors')}, format='newline_delimited', ignore_errors=true,
                 columns={{user_id:'varchar', ts_ms:'bigint', item_id:'varchar', category_id:'varchar', brand_id:'varchar',
                          action:'varchar'}})
            where ts_ms between {start} and {start + DAY_MS - 1}),
        events as (
            select 'impression' as event_kind, i.user_id, i.ts_ms, i.request_id, i.impression_id, i.ad_id as item_id, i.ad_id,
                   i.campaign_id, i.advertiser_id, i.category_id, i.brand_id, i.position, i.surface, i.device,
                   null as action, (w.impression_id is not null)::int as label, w.click_type, w.dwell_ms, w.click_ts_ms
            from imps i left join winners w using (impression_id)
            union all by name
            select 'behavior' as event_kind, user_id, ts_ms, item_id, category_id, brand_id, action from beh)
        select {cols} from events order by ts_ms, user_id) to '{out}' (format parquet)""")
    con.close()
    return time.perf_counter() - t0


def jvm_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat), all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(action, jvm_pid: int) -> tuple[float, float]:
    """(wall seconds, Spark driver JVM CPU seconds) of one call: the CPU figure holds on a shared
    machine, where the wall time depends on what else runs."""
    t0, c0 = time.perf_counter(), jvm_cpu_s(jvm_pid)
    action()
    return time.perf_counter() - t0, jvm_cpu_s(jvm_pid) - c0


def spark_floor_s(spark, files: list[Path], jvm_pid: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall s, JVM CPU s) (the faster of 2 after a warm-up) for Spark to read the files as text and count
    the lines, and to parse every line with ``from_json(..., 'map<string,string>')`` and count the objects."""
    from pyspark.sql import functions as F

    paths = [str(f) for f in files]

    def best(action) -> tuple[float, float]:
        action()
        return min(timed(action, jvm_pid) for _ in range(2))

    read = best(lambda: spark.read.text(paths).count())
    parse = best(lambda: spark.read.text(paths).select(F.from_json("value", "map<string,string>").alias("m"))
                 .filter(F.col("m").isNotNull()).count())
    return read, parse


def stage_seconds(spark, home: Path, day: str, jvm_pid: int) -> list[tuple[str, float, float]]:
    """(stage, wall s, JVM CPU s) of the job's own steps on day D (transforms.spark.events, in run_events_job's
    order), each timed as its own action: the frames read -> set aside -> parsed -> decided are cumulative and
    forced by a ``noop`` write of every column; then both checkpoints, the counts and both writes. Where the
    job's time goes, not a second job: the whole-job figure stays the one above."""
    from transforms.spark import events as E

    def noop(frame):
        frame.write.format("noop").mode("overwrite").save()

    stages: list[tuple[str, float, float]] = []

    def stage(name, action):
        result = []
        wall, cpu = timed(lambda: result.append(action()), jvm_pid)
        stages.append((name, wall, cpu))
        return result[0]

    sources = E.day_sources(home, day)[3]
    saved = {k: spark.conf.get(k, None) for k in E.JOB_CONF}
    for k, v in E.JOB_CONF.items():
        spark.conf.set(k, v)
    try:
        lines = E.read_lines(spark, sources)
        stage("read_lines", lambda: noop(lines))
        aside = E.set_aside_unclicked(lines, day)
        stage("+ set_aside_unclicked", lambda: noop(aside))
        parsed = E.parse_lines(aside)
        stage("+ parse_lines", lambda: noop(parsed))
        decided = E.decide_lines(parsed, int(spark.conf.get("spark.sql.shuffle.partitions")))
        stage("+ decide_lines (both duplicate rules)", lambda: noop(decided))
        held = stage("decided lines checkpointed (all of the above again)", lambda: E._checkpoint(decided))
        clicks = stage("clicks attributed (checkpoint)", lambda: E._checkpoint(E.attribute_clicks(held, 60 * 60_000)))
        resolved = E.with_clicks(held, clicks)
        stage("ledger counts", lambda: E.ledger_counts(resolved).collect())
        scratch = home / "bench-stages"
        stage("events written (sorted, one file)",
              lambda: E.write_partition(E.build_events(resolved, day), scratch / "events", day, E.EVENT_SORT, 1))
        stage("quarantine written", lambda: E.write_partition(E.build_quarantine(resolved, day), scratch / "quarantine", day,
                                                              ("kind", "source_file", "line_no"), 1))
        E._release(clicks)
        E._release(held)
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    return stages


def peak_rss_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=9, help="override the preset's number of days (0: keep); 9 give D-1/D+1 around 7 days")
    ap.add_argument("--home", default=None, help="data root for the world (default /tmp/genrank-bench-<preset>)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--growth", default="1,3,7", help="day counts for the growth figure ('' to skip)")
    ap.add_argument("--write", action="store_true", help="write the figures to benchmarks/RESULTS.spark.md")
    ap.add_argument("--stages", action="store_true", help="also time the job's own steps one by one on day D")
    args = ap.parse_args(argv)

    from contracts import settings
    from transforms.spark.events import run_events_job
    from transforms.spark.session import build_session

    home = Path(args.home or f"/tmp/genrank-bench-{args.preset}")
    manifest, _ = ensure_world(home, args.preset, args.seed, args.days or None)
    days = manifest["days"]
    day = days[1] if len(days) >= 3 else days[0]
    lines_d = sum(v["lines"] for v in manifest["files"][day].values())
    driver_memory = settings.spark_driver_memory()
    spark = build_session(master=args.master, driver_memory=driver_memory, app_name="genrank-bench")
    jvm_pid = spark.sparkContext._gateway.proc.pid

    print(f"day {day}: {lines_d:,} input lines in D's files; warm-up on {args.master} ...", flush=True)
    warm = run_events_job(spark, home, day)
    print(warm.summary())
    mismatch = manifest_mismatches(manifest["files"][day], warm)
    print("quarantine/duplicate counts vs the simulator manifest:", "exact match" if not mismatch else mismatch)
    times, cpus = [], []
    for rep in range(args.repeats):
        wall, cpu = timed(lambda: run_events_job(spark, home, day), jvm_pid)
        times.append(wall)
        cpus.append(cpu)
        print(f"  run {rep + 1}: {wall:.2f} s, {lines_d / wall:,.0f} lines/s, {cpu:.1f} s of driver JVM CPU", flush=True)
    job_s, job_cpu = statistics.median(times), statistics.median(cpus)

    duck_out = home / "bench-duckdb-events.parquet"
    duck_s = duckdb_same_output(home, day, duck_out, threads=2)
    day_files = sorted((home / "landing" / f"date={day}").glob("*.jsonl.gz"))
    parsed, orjson_s = gzip_orjson_lines_per_s(day_files)
    (read_s, read_cpu), (parse_s, parse_cpu) = spark_floor_s(spark, day_files, jvm_pid)

    stages = stage_seconds(spark, home, day, jvm_pid) if args.stages else []

    growth = []
    for n in [int(x) for x in args.growth.split(",") if x]:
        span = days[1:1 + n]
        if len(span) < n:
            print(f"  growth: {n} days need {n + 2} simulated days (have {len(days)}); skipped")
            continue
        t0 = time.perf_counter()
        lines = sum(run_events_job(spark, home, d).input_lines for d in span)
        growth.append((n, lines, time.perf_counter() - t0))
        print(f"  {n} day(s): {growth[-1][2]:.1f} s, {growth[-1][2] / n:.1f} s/day, {lines / growth[-1][2]:,.0f} lines/s", flush=True)
    jvm_rss, py_rss = peak_rss_mib(jvm_pid), peak_rss_mib(os.getpid())
    spark.stop()

    load = os.getloadavg()
    rows = [
        ("events job (Spark, whole job)", job_s, lines_d / job_s, 1.0),
        ("DuckDB read_json -> same event table (2 threads, lenient)", duck_s, lines_d / duck_s, job_s / duck_s),
        ("gzip + orjson parse, one core (the practical limit)", orjson_s, parsed / orjson_s, job_s / orjson_s),
        (f"Spark floor: D's files read as text + count ({args.master})", read_s, lines_d / read_s, job_s / read_s),
        (f"Spark floor: from_json map<string,string> of D's lines ({args.master})", parse_s, lines_d / parse_s,
         job_s / parse_s),
    ]
    cpu_rows = [("events job", job_cpu), ("floor: read as text + count", read_cpu), ("floor: from_json map", parse_cpu)]
    print("\nresults (day D)")
    for name, sec, rate, ratio in rows:
        print(f"  {name:70s} {sec:7.2f} s  {rate:>10,.0f} lines/s  job time / this: x{ratio:.2f}")
    print("  driver JVM CPU seconds (all cores): " + ", ".join(
        f"{name} {cpu:.1f} s (job / this x{job_cpu / cpu:.2f})" for name, cpu in cpu_rows))
    if stages:
        print("  the job's steps on day D, each its own action (wall s, driver JVM CPU s):")
        for name, wall, cpu in stages:
            print(f"    {name:55s} {wall:6.2f} s {cpu:6.1f} CPU s")
    if growth:
        base = growth[0][2] / growth[0][0]
        print("  growth: " + ", ".join(f"{n} d {t:.1f} s ({t / n / base:.2f} x the 1-day time per day)" for n, _, t in growth))
    print(f"  peak RSS: Spark driver JVM {jvm_rss:,.0f} MiB (spark.driver.memory={driver_memory}), Python {py_rss:,.0f} MiB")
    print(f"  load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} cores")

    if args.write:
        cmd = " ".join([".venv/bin/python benchmarks/spark_aggregation.py", *[shlex.quote(a) for a in (argv or sys.argv[1:])]])
        table = "\n".join(f"| {name} | {sec:.2f} | {rate:,.0f} | x{ratio:.2f} |" for name, sec, rate, ratio in rows)
        grow = "\n".join(f"| {n} | {lines:,} | {t:.1f} | {t / n:.1f} | {t / n / (growth[0][2] / growth[0][0]):.2f} |"
                          for n, lines, t in growth)
        (REPO / "benchmarks" / "RESULTS.spark.md").write_text(f"""# Spark events job benchmark

    {cmd}

World: preset `{manifest['preset']}`, seed {manifest['seed']}, {len(days)} days; measured day {day}: {lines_d:,} input lines
({warm.lines_read:,} read with D-1's impressions+clicks and D+1's clicks). Manifest counts: {'exact match' if not mismatch else mismatch}.
Master {args.master}, spark.driver.memory={driver_memory}; median of {args.repeats} runs after a warm-up.

| pipeline | s | lines/s of D | job time / this |
|---|---|---|---|
{table}

| days | input lines | s | s/day | s/day vs 1 day |
|---|---|---|---|---|
{grow}

Driver JVM CPU seconds (all cores; what the wall times above become on a machine shared with other
work): {"; ".join(f"{name} {cpu:.1f} s (job / this x{job_cpu / cpu:.2f})" for name, cpu in cpu_rows)}.

Peak RSS: Spark driver JVM {jvm_rss:,.0f} MiB, Python {py_rss:,.0f} MiB. Load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}
on {os.cpu_count()} cores (shared machine).
""")
        print("wrote benchmarks/RESULTS.spark.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
