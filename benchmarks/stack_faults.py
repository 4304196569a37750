"""Faults on the production rehearsal (deploy/stack.py), scripted: a fresh stack on a fresh home of the tiny
world, days landed one by one, and what the pipeline does when

1. the Spark worker is killed while day 1's `events` step runs: the step fails once its job has had no
   executor for GENRANK_SPARK_EXECUTOR_WAIT_S (transforms/spark/session.py), naming the master; the
   daily job's retry runs once `genrank stack up` has started a worker again;
2. PostgreSQL is restarted between day 1 and day 2 (the daemon keeps running): no day runs twice;
3. the MLflow server is stopped while day 4's student registers (once its MLflow run exists): the step
   fails, no unfinished version is ever found and no alias moves; the retry, once the server is back,
   registers the version once (deploy/registry.py).

Days 3 and 4 land together: day 3 then runs with day 4's late clicks, where landing day 4 after day 3
ran would change day 3's inputs and, by design (pipelines/operating.py), request it again. Printed as it
happens, with the runs of every day at the end (no day may succeed twice on the same landing content).
Usage: python benchmarks/stack_faults.py [--keep]   (--keep leaves the stack up and its home in place)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy import registry as reg  # noqa: E402
from deploy.stack import Ports, Stack  # noqa: E402
from pipelines.operating import FINGERPRINT_TAG  # noqa: E402
from transforms import landing  # noqa: E402
from transforms.simulator import simulate  # noqa: E402

T0 = time.monotonic()
FAULT_ENV = {
    "GENRANK_LATENCY_BUDGET_MS": "1e9",   # the latency gate would judge these loaded cores, not the fault
    "GENRANK_SENSOR_INTERVAL_S": "5",
    "GENRANK_START_DATE": "2026-01-01",   # the tiny world's first day
    "GENRANK_TRAIN_PROCS": "2",           # torchrun's two processes, as the rehearsal runs them
    "GENRANK_SPARK_EXECUTOR_WAIT_S": "90",
    # An MLflow client rides out a server that is away for about 4 min by default (7 retries): 4 retries
    # (about 30 s per request) let the registration fail within the check.
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4",
}


def say(line: str) -> None:
    print(f"[{time.monotonic() - T0:6.0f} s] {line}", flush=True)


def service(stack: Stack, name: str):
    return next(s for s in stack.services() if s.name == name)


def runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return sorted(instance.get_runs(dg.RunsFilter(job_name="daily_job")), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)


def wait(what: str, predicate, timeout_s: float = 2400, every_s: float = 3):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every_s)
    return value


def day_runs(instance, day: str) -> list[dg.DagsterRun]:
    return [r for r in runs(instance) if r.tags.get("dagster/partition") == day]


def step_started(instance, run_id: str, step: str) -> bool:
    return any(e.step_key == step for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START))


def day_done(instance, day: str) -> bool:
    return any(r.status == dg.DagsterRunStatus.SUCCESS for r in day_runs(instance, day))


def first_failed(instance, day: str) -> dg.DagsterRun | None:
    return next((r for r in day_runs(instance, day) if r.status == dg.DagsterRunStatus.FAILURE), None)


def day_settled(instance, day: str) -> bool:
    """Succeeded, or failed with no retry to come."""
    return day_done(instance, day) or any(r.status == dg.DagsterRunStatus.FAILURE and r.tags.get("dagster/will_retry") != "true"
                                          for r in day_runs(instance, day))


def failures(instance, run_id: str) -> list[str]:
    """Each failed step and why: the first line of its innermost cause (Dagster wraps the step's error), or
    its line that says why Spark cancelled the job."""
    found = []
    for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        error = e.dagster_event.event_specific_data.error
        while error.cause is not None:
            error = error.cause
        lines = [line.strip() for line in error.message.splitlines() if line.strip()]
        why = next((line for line in lines if "cancelled because" in line), lines[0] if lines else error.cls_name)
        found.append(f"{e.step_key}: {error.cls_name}: {why[:400]}")
    return found


def report_day(instance, day: str) -> None:
    for r in day_runs(instance, day):
        say(f"  run {r.run_id[:8]} {day} {r.status.value} retry_of={r.parent_run_id and r.parent_run_id[:8]} "
            f"failures={failures(instance, r.run_id)}")


def registry_state(registry: reg.Registry) -> dict[str, object]:
    versions = registry.client.search_model_versions(f"name = '{reg.CTR}'")
    return {
        "versions": sorted((int(v.version), v.tags.get("partition"), v.tags.get(reg.REGISTRATION_TAG, "-")) for v in versions),
        "aliases": {alias: getattr(registry.by_alias(reg.CTR, alias), "version", None) for alias in ("champion", "challenger", "previous")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="genrank-faults-"))
    home.chmod(0o755)
    world = home / "world"
    report = simulate(preset="tiny", seed=0, out=world)
    stack = Stack(home, Ports.free(), env=FAULT_ENV)
    try:
        started = time.monotonic()
        stack.up(log=say)
        say(f"stack up in {time.monotonic() - started:.0f} s")
        os.environ.update({k: v for k, v in stack.pipeline_env().items() if k.startswith("DAGSTER_PG_")})
        instance = dg.DagsterInstance.from_config(str(stack.dagster_home))
        registry = reg.default_registry(home, stack.pipeline_env()["MLFLOW_TRACKING_URI"])
        d1, d2, d3, d4 = report.days[:4]

        say(f"fault 1: land {d1} and {d2}; kill the Spark worker once {d1}'s events step runs")
        landing.land_days(world, home, [d1, d2])
        run = wait("day 1 run", lambda: next(iter(runs(instance)), None))
        wait("events step", lambda: step_started(instance, run.run_id, "events"), every_s=1)
        time.sleep(5)       # the executor has registered and works
        service(stack, "spark-worker").stop(stack.folder)
        killed = time.monotonic()
        say("spark-worker killed (SIGTERM to its process group, executors included)")
        failed = wait(f"{d1} fails", lambda: first_failed(instance, d1), timeout_s=900, every_s=2)
        say(f"{d1}'s run {failed.status.value} {time.monotonic() - killed:.0f} s after the kill "
            f"(will_retry={failed.tags.get('dagster/will_retry')}): {failures(instance, failed.run_id)}")
        stack.up(log=say)    # brings the worker back (the other services are reported as up)
        wait(f"{d1} settled", lambda: day_settled(instance, d1))
        report_day(instance, d1)

        say(f"fault 2: restart PostgreSQL between {d1} and {d2} (the daemon keeps running)")
        daemon_pid = stack.status()["dagster-daemon"]
        service(stack, "postgres").stop(stack.folder)
        say("postgres stopped; waiting 30 s")
        time.sleep(30)
        stack.up(log=say)
        say(f"daemon pid before {daemon_pid}, after {stack.status()['dagster-daemon']}")
        landing.land_days(world, home, [d3, d4])
        wait(f"{d2} settled", lambda: day_settled(instance, d2))
        report_day(instance, d2)
        wait(f"{d3} settled", lambda: day_settled(instance, d3))
        report_day(instance, d3)

        say(f"fault 3: stop the MLflow server once {d4}'s student registers (its MLflow run exists)")
        experiment = registry.experiment_id(reg.CTR)
        wait(f"{d4}'s student run", lambda: registry.client.search_runs([experiment], f"attributes.run_name = 'student-{d4}'"),
             every_s=0.5)
        before = registry_state(registry)    # the day's evaluation and promotion ran before its student step
        service(stack, "mlflow").stop(stack.folder)
        say(f"  registry before the stop: {before}")
        stopped = time.monotonic()
        say("mlflow server stopped")
        failed = wait(f"{d4} fails", lambda: first_failed(instance, d4), timeout_s=900, every_s=2)
        say(f"{d4}'s run {failed.status.value} {time.monotonic() - stopped:.0f} s after the stop "
            f"(will_retry={failed.tags.get('dagster/will_retry')}): {failures(instance, failed.run_id)}")
        stack.up(log=say)
        after = registry_state(registry)
        say(f"  registry once the server is back: {after}")
        unfinished = [v for v in after["versions"] if v[1] == d4 and v[2] == reg.IN_PROGRESS]
        found = registry.find(reg.CTR, partition=d4)
        say(f"  {d4}: unfinished versions {unfinished}, find() -> {getattr(found, 'version', None)}; "
            f"aliases {'unchanged' if after['aliases'] == before['aliases'] else 'MOVED'}")
        wait(f"{d4} settled", lambda: day_settled(instance, d4))
        report_day(instance, d4)
        say(f"  registry after the retry: {registry_state(registry)}")

        time.sleep(30)       # more sensor ticks: nothing more may start
        by_day: dict[str, list[str]] = {}
        for r in runs(instance):
            by_day.setdefault(r.tags.get("dagster/partition"), []).append(r.status.value)
        say(f"runs by day: {by_day}")
        successes = [(r.tags.get("dagster/partition"), r.tags.get(FINGERPRINT_TAG)) for r in runs(instance)
                     if r.status == dg.DagsterRunStatus.SUCCESS]
        twice = sorted({day for day, fingerprint in successes if successes.count((day, fingerprint)) > 1})
        say("no day ran twice" if not twice else f"days that succeeded twice on the same landing content: {twice}")
        done = all(day_done(instance, d) for d in (d1, d2, d3, d4))
        moved = after["aliases"] != before["aliases"]
        return 0 if done and not twice and not moved and found is None else 1
    finally:
        if not args.keep:
            stack.down(log=say)
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
