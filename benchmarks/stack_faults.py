"""Faults on the production rehearsal (deploy/stack.py), scripted: a fresh stack on a fresh home of the tiny
world, days landed one by one, and what the pipeline does when

1. the Spark worker is killed while day 1's `events` step runs (then started again),
2. PostgreSQL is restarted between day 1 and day 2 (the daemon keeps running),

printed as it happens, with the runs of every day at the end (no day may have two successful runs).
Usage: python benchmarks/stack_faults.py [--keep]   (--keep leaves the stack up and its home in place)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy.stack import Stack, Ports  # noqa: E402
from tests.operating.services import free_port  # noqa: E402
from tests.operating.test_daemon import _land_all  # noqa: E402
from tests.stack.test_stack import RUN_ENV, _free_spark_ports  # noqa: E402
from transforms.simulator import simulate  # noqa: E402

T0 = time.monotonic()


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


def step_started(instance, run_id: str, step: str) -> bool:
    return any(e.step_key == step for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START))


def day_done(instance, day: str) -> bool:
    return any(r.tags.get("dagster/partition") == day and r.status == dg.DagsterRunStatus.SUCCESS for r in runs(instance))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="genrank-faults-"))
    home.chmod(0o755)
    world = home / "world"
    report = simulate(preset="tiny", seed=0, out=world)
    stack = Stack(home, Ports(free_port(), free_port(), _free_spark_ports(), free_port()), env=RUN_ENV)
    try:
        started = time.monotonic()
        stack.up(log=say)
        say(f"stack up in {time.monotonic() - started:.0f} s")
        import os
        os.environ.update({k: v for k, v in stack.pipeline_env().items() if k.startswith("DAGSTER_PG_")})
        instance = dg.DagsterInstance.from_config(str(stack.dagster_home))
        d1, d2, d3 = report.days[:3]

        say(f"fault 1: land {d1} and {d2}; kill the Spark worker once {d1}'s events step runs")
        _land_all(world, home, [d1, d2])
        run = wait("day 1 run", lambda: next(iter(runs(instance)), None))
        wait("events step", lambda: step_started(instance, run.run_id, "events"), every_s=1)
        time.sleep(5)       # the executor has registered and works
        service(stack, "spark-worker").stop(stack.folder)
        say("spark-worker killed (SIGTERM to its process group, executors included)")
        time.sleep(60)
        status = instance.get_run_by_id(run.run_id).status
        say(f"60 s later the run is {status.value}; events step finished: "
            f"{any(e.step_key == 'events' for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS))}")
        stack.up(log=say)    # brings the worker back (the other services are reported as up)
        wait(f"{d1} done", lambda: day_done(instance, d1) or any(r.status == dg.DagsterRunStatus.FAILURE and not r.tags.get("dagster/will_retry") == "true" for r in runs(instance)))
        for r in runs(instance):
            failures = [e.dagster_event.event_specific_data.error.message.strip().splitlines()[-1][:300]
                        for e in instance.all_logs(r.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]
            say(f"  run {r.run_id[:8]} {r.tags.get('dagster/partition')} {r.status.value} retry_of={r.parent_run_id and r.parent_run_id[:8]} failures={failures}")

        say(f"fault 2: restart PostgreSQL between {d1} and {d2} (the daemon keeps running)")
        daemon_pid = stack.status()["dagster-daemon"]
        pg = service(stack, "postgres")
        pg.stop(stack.folder)
        say("postgres stopped; waiting 30 s")
        time.sleep(30)
        stack.up(log=say)
        say(f"daemon pid before {daemon_pid}, after {stack.status()['dagster-daemon']}")
        _land_all(world, home, [d3])
        wait(f"{d2} done", lambda: day_done(instance, d2))
        time.sleep(30)       # more sensor ticks: nothing more may start
        by_day: dict[str, list[str]] = {}
        for r in runs(instance):
            by_day.setdefault(r.tags.get("dagster/partition"), []).append(r.status.value)
        say(f"runs by day: {by_day}")
        twice = [d for d, statuses in by_day.items() if statuses.count("SUCCESS") > 1]
        say("no day ran twice" if not twice else f"days that succeeded twice: {twice}")
        return 1 if twice else 0
    finally:
        if not args.keep:
            stack.down(log=say)
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
