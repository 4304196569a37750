"""A Spark job on a standalone cluster with no worker fails instead of hanging, naming the master and what was
missing (transforms/spark/session.py watch_executors), and the next session runs once a worker is back:
the stack's own Spark master and worker (deploy/stack.py), each session in a process of its own so this
test's JVM never replaces the test session's local Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from deploy.stack import REPO, Ports, Stack

pytestmark = [pytest.mark.stack, pytest.mark.spark]

EXECUTOR_WAIT_S = 5   # the job with no worker; the job after the worker is back waits the default 300 s, so a slow
                      # executor start on a loaded machine cannot cancel it
JOB = """
import sys, time
from transforms.spark.session import build_session
spark = build_session(master=sys.argv[1], driver_memory="1g", shuffle_partitions=2, executor_wait_s=float(sys.argv[2]))
started = time.monotonic()
try:
    print("rows", spark.range(1000).count(), flush=True)
except Exception as exc:
    print(f"failed after {time.monotonic() - started:.0f} s:", str(exc).splitlines()[:3], flush=True)
spark.stop()
"""


def _start(stack: Stack, name: str, timeout_s: float = 300) -> float:
    service = next(s for s in stack.services() if s.name == name)
    started = time.monotonic()
    service.launch(stack.folder, {**os.environ, **service.env}, stack.folder / f"{name}.log", die_with_parent=True)
    while not service.ready():
        assert time.monotonic() - started < timeout_s, (stack.folder / f"{name}.log").read_text()[-3000:]
        time.sleep(1)
    return time.monotonic() - started


def _job(master: str, executor_wait_s: float) -> str:
    done = subprocess.run([sys.executable, "-c", JOB, master, str(executor_wait_s)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.timeout(1200)
def test_a_job_without_executors_fails_naming_the_master_and_runs_once_a_worker_is_back(tmp_path):
    stack = Stack(tmp_path, Ports.free())
    (stack.folder / "logs").mkdir(parents=True)
    master = f"spark://127.0.0.1:{stack.ports.spark}"
    try:
        print(f"spark-master up in {_start(stack, 'spark-master'):.1f} s")
        started = time.monotonic()
        lost = _job(master, EXECUTOR_WAIT_S)
        print(f"no worker: {lost.strip()} ({time.monotonic() - started:.0f} s with the session's start-up)")
        # it failed rather than hung (this test's timeout is the bound), and says what it waited for
        assert f"the Spark master {master} gave this application no executor for {EXECUTOR_WAIT_S} s" in lost

        print(f"spark-worker up in {_start(stack, 'spark-worker'):.1f} s")
        back = _job(master, 300)
        print(f"worker back: {back.strip()}")
        assert "rows 1000" in back
    finally:
        stopped = stack.down(log=print)
    assert sorted(stopped) == ["spark-master", "spark-worker"] and not any(stack.folder.glob("*.pid"))
