"""SparkSession construction for genrank jobs.

``build_session(master, driver_memory, shuffle_partitions)`` is what ``assets.resources.SparkResource``
calls. It checks for a Java runtime first (PySpark needs a JVM) and stops with a message saying how to
install one, instead of PySpark's opaque "Java gateway process exited" error.

Defaults are chosen for a small shared machine and for correctness of the events job:

* ``spark.sql.session.timeZone=UTC`` — landing days are UTC calendar days;
* the web UI is off (no port to bind in tests or in sandboxes);
* ``spark.sql.shuffle.partitions`` small (default 4) — a day of logs is a few million lines;
* adaptive query execution on, so small shuffles are coalesced;
* ``master`` is ``local[*]`` by default; any cluster URL works as long as the data root is reachable
  from the executors (the events job reads and writes plain paths under the data root).

**A lost cluster fails the job in bounded time.** On a cluster master a job whose executors are gone
does not fail: Spark re-queues its tasks and waits for resources, for ever when no worker comes back
(a Spark standalone master with its only worker killed, measured in benchmarks/stack_faults.py). So a
session on a cluster master runs :func:`watch_executors`: once a job has had no executor for
``executor_wait_s`` seconds, every active job is cancelled with a reason that names the master and what
was missing, and the action that waits raises it (the events step fails with that message; the daily
job's retry re-runs the step once a worker is back). Chosen over Dagster's ``dagster/max_runtime`` run
monitoring, which only knows that a whole run is slow: it would cap the training steps too, fire long
after the cluster was lost, and say nothing about Spark. The embedded ``local[*]`` master runs its tasks
in the driver and has no executor to lose: no watchdog there.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from contracts import settings

JAVA_INSTALL_HINT = (
    "PySpark needs a Java runtime (17 recommended) and none was found "
    "(no `java` on PATH and JAVA_HOME is unset or has no bin/java). Install one, e.g. on Debian/Ubuntu:\n"
    "    apt-get update && apt-get install -y openjdk-17-jre-headless\n"
    "or point JAVA_HOME at an existing JDK/JRE."
)


class JavaNotFoundError(RuntimeError):
    """No Java runtime: the message says how to install one."""


def find_java() -> str | None:
    """Path of the java executable Spark will use (JAVA_HOME first, then PATH), or None."""
    java_home = settings.java_home()
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.exists() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def require_java() -> str:
    java = find_java()
    if java is None:
        raise JavaNotFoundError(JAVA_INSTALL_HINT)
    return java


def build_session(
    master: str = "local[*]",
    driver_memory: str = settings.VARIABLES["GENRANK_SPARK_DRIVER_MEMORY"][0],
    shuffle_partitions: int = 4,
    app_name: str = "genrank-events",
    extra_conf: dict[str, str] | None = None,
    executor_wait_s: float = 300,
):
    """Create (or return the active) SparkSession configured for genrank.

    If a session with a *different* master is active it is stopped first, so ``master`` is always
    honoured (the benchmark switches between ``local[1]`` and ``local[2]`` this way). On a cluster
    master, a job with no executor for ``executor_wait_s`` seconds is cancelled (:func:`watch_executors`).
    """
    if executor_wait_s <= 0:
        raise ValueError(f"executor_wait_s must be positive seconds, got {executor_wait_s}")
    require_java()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        if active.sparkContext.master == master:
            active.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
            return active
        active.stop()

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(max(shuffle_partitions, 1)))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        # Whole-stage code of the events parse is one method above the JVM's 8,000-byte JIT limit:
        # without this flag it stays interpreted (measured: the parse ran ~1.5x slower).
        .config("spark.driver.extraJavaOptions", "-XX:-DontCompileHugeMethods")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        # Parquet readable by DuckDB/pyarrow without surprises: plain INT64 timestamps are not used
        # (ts are bigint epoch ms), snappy compression.
        .config("spark.sql.parquet.compression.codec", "snappy")
        # No _SUCCESS/crc noise in the lake partitions beyond what DuckDB globs ignore anyway.
        .config("spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .config("spark.hadoop.parquet.enable.summary-metadata", "false")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        watch_executors(session.sparkContext, executor_wait_s)
    return session


def shrink_driver_heap(session) -> None:
    """A full collection of the driver JVM's heap, after which G1 hands the heap a finished job grew back
    to the OS (it shrinks the committed heap only after a full collection). The driver stays up between
    daily runs and under a day's training steps: after a `large` day it held 1.15 GB resident where it
    now holds 0.77 GB, for 0.1 s (benchmarks/RESULTS.md, "The driver's heap")."""
    session.sparkContext._jvm.System.gc()


def watch_executors(sc, wait_s: float, poll_s: float = 2.0) -> threading.Thread:
    """Cancel every active job of ``sc`` once jobs have run for ``wait_s`` seconds with no executor alive.

    A daemon thread polls Spark's status tracker (its executor list always holds the driver, so the
    executors are the others) and ends with the SparkContext. Time without executors counts only while a
    job is active, so an idle application whose executors were released is not blamed.
    """
    master = sc.master

    def watch() -> None:
        waiting_since = None
        while (jsc := sc._jsc) is not None and not jsc.sc().isStopped():
            tracker = jsc.sc().statusTracker()
            jobs = list(tracker.getActiveJobIds())
            if not jobs or len(tracker.getExecutorInfos()) > 1:
                waiting_since = None
            elif waiting_since is None:
                waiting_since = time.monotonic()
            elif time.monotonic() - waiting_since >= wait_s:
                reason = (f"because the Spark master {master} gave this application no executor for {wait_s:.0f} s "
                          f"(no alive worker with free cores and memory, or its workers were lost): start a worker, "
                          f"then retry")
                for job in jobs:
                    jsc.sc().cancelJob(job, reason)
            time.sleep(poll_s)

    def run() -> None:
        from py4j.protocol import Py4JError

        try:
            watch()
        except (Py4JError, ConnectionError, AttributeError):
            pass   # the session stopped (its gateway went) between two polls

    thread = threading.Thread(target=run, name=f"genrank-executor-watchdog {master}", daemon=True)
    thread.start()
    return thread
