"""Where a `genrank run` day spends its time and memory: each step's wall time (from the Dagster instance's step
stats) and the peak resident memory of the run's process tree while the step ran (sampled from /proc: the
Python process, the Spark driver JVM it started, dbt's subprocess, torchrun's workers).

The peak is the tree's, not the step's own allocation: what an earlier step left resident (the JVM stays up
for the next day, torch stays imported) counts in every later step, which is what sizing a machine needs.
Off Linux (no /proc) only the times are reported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def tree_rss_bytes(root: int) -> int | None:
    """Resident memory of ``root`` and every descendant, in bytes; None without /proc."""
    if not (PROC / str(root)).exists():
        return None
    children: dict[int, list[int]] = {}
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:   # the process ended between the listing and the read
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(text[:text.index(" ")]))
    page, total, todo = os.sysconf("SC_PAGE_SIZE"), 0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += int((PROC / str(pid) / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        todo += children.get(pid, [])
    return total


class PeakByStep:
    """Samples, every ``interval_s`` while it runs, the current step (``current_step()``) and the process
    tree's RSS, keeping each step's peak in bytes. A context manager around one run."""

    def __init__(self, current_step: Callable[[], str | None], interval_s: float = 0.5, root: int | None = None):
        self.current_step, self.interval_s, self.root = current_step, interval_s, root or os.getpid()
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="genrank-stage-profile", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                step, rss = self.current_step(), tree_rss_bytes(self.root)
            except Exception:   # a transient read of the event log must not end the run
                continue
            if step and rss is not None:
                self.peaks[step] = max(self.peaks.get(step, 0), rss)

    def __enter__(self) -> "PeakByStep":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def step_seconds(instance, run_id: str) -> dict[str, float]:
    """Each finished step of the run -> its wall seconds, in the order the steps started."""
    stats = sorted((s for s in instance.get_run_step_stats(run_id) if s.start_time and s.end_time),
                   key=lambda s: s.start_time)
    return {s.step_key: s.end_time - s.start_time for s in stats}


def return_freed_heap() -> bool:
    """Collects Python's garbage and asks glibc to hand the heap's free pages back to the OS (malloc_trim);
    False where there is no glibc. A day's steps share one process (jobs.daily_job's in-process executor):
    what a step freed otherwise stays resident in the C heap, counted in every later step's memory until an
    allocation reuses it."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is None:
        return False
    try:
        trim = ctypes.CDLL(libc).malloc_trim
    except (OSError, AttributeError):   # musl and macOS have no malloc_trim
        return False
    trim(0)
    return True
