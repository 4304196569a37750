"""A world's training samples: the pipeline's ingest and sequences stages over its landing days, run in a child
process (this module, `python -m benchmarks.quality_suite.samples HOME`, from the repository root)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sample_days(home: Path) -> list[str]:
    root = home / "lake" / "training_samples"
    return sorted(p.name.removeprefix("date=") for p in root.glob("date=*")
                  if (p / "part-0.parquet").exists()) if root.is_dir() else []


def build_training_samples(home: Path) -> None:
    """Runs the pipeline's ingest and sequences assets (Spark events, dbt sequences and their checks)
    for every complete landing day without training samples yet, in order, in a child process: the
    partitions definition reads GENRANK_HOME at import, and the Spark JVM should not outlive it."""
    from transforms import landing

    landed = landing.complete_days(home)
    todo = [d for d in landed if d not in set(sample_days(home))]
    if not todo:
        return
    # the first daily partition is the world's first landing day, as the `genrank` commands pin it
    env = {**os.environ, "GENRANK_HOME": str(home), "GENRANK_TORCH_THREADS": "1", "GENRANK_START_DATE": landed[0]}
    env.pop("DAGSTER_HOME", None)   # a private instance under the world's home
    logfile = home / "quality-pipeline.log"
    print(f"  pipeline (events + sequences) for {len(todo)} day(s) {todo[0]}..{todo[-1]}; log: {logfile}", flush=True)
    t0 = time.perf_counter()
    with open(logfile, "a") as out:
        rc = subprocess.run([sys.executable, "-m", "benchmarks.quality_suite.samples", str(home)], env=env,
                            stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT)).returncode
    if rc != 0:
        raise RuntimeError(f"the pipeline stages failed for {home} (exit {rc}); see {logfile}")
    print(f"  pipeline done in {time.perf_counter() - t0:.0f} s", flush=True)


def _build_samples_child(home: Path) -> int:
    """Child process of build_training_samples (this module run with -m)."""
    import dagster as dg

    from pipelines.runner import prepare_instance
    from transforms import landing

    instance = prepare_instance(home)
    from pipelines.definitions import defs
    from assets.partitions import daily_partitions

    selection = dg.AssetSelection.groups("ingest", "sequences") - dg.AssetSelection.assets("raw_logs")
    jobs = [dg.define_asset_job("quality_samples_job", selection=selection, partitions_def=daily_partitions()),
            dg.define_asset_job("quality_sequences_job", selection=dg.AssetSelection.groups("sequences"),
                                partitions_def=daily_partitions())]
    resolved = dg.Definitions(assets=list(defs.assets), asset_checks=list(defs.asset_checks or []), jobs=jobs,
                              resources=defs.resources)
    samples_job, sequences_job = (resolved.resolve_job_def(j.name) for j in jobs)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    tags = {"genrank/launched_by": "benchmarks/quality_report.py"}
    done = set(sample_days(home))
    for day in landing.complete_days(home):
        if day in done:
            continue
        t0 = time.perf_counter()
        r = samples_job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False, run_config=quiet,
                                           tags=tags)
        failed = [f"{e.asset_key.to_user_string()}:{e.check_name}" for e in r.get_asset_check_evaluations()
                  if not e.passed and e.severity.value == "ERROR"]
        if not r.success and failed == ["events:events_not_empty"] and _landing_lines(home, day) == 0:
            # An empty landing day (the importer's --fill-gaps) stops the pipeline at the blocking check
            # events_not_empty, although its (empty) events partition is written; the sequences still need
            # the day for contiguous partitions, so they are built on their own.
            r = sequences_job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False,
                                                 run_config=quiet, tags=tags)
            print(f"QUALITY {day} empty landing day: events_not_empty failed as designed; sequences alone "
                  f"success={r.success}", flush=True)
        print(f"QUALITY {day} success={r.success} {time.perf_counter() - t0:.1f}s", flush=True)
        if not r.success:
            return 1
    return 0


def _landing_lines(home: Path, day: str) -> int:
    from transforms import landing

    return sum(landing.open_day(home, day, verify=False).line_counts.values())


if __name__ == "__main__":
    sys.exit(_build_samples_child(Path(sys.argv[1])))
