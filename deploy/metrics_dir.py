"""The directory the workers of one `genrank serve` run share their Prometheus metrics through.

prometheus_client chooses between in-process and multiprocess values when it is first imported, from
``PROMETHEUS_MULTIPROC_DIR``: the variable must be exported before any worker (or, with one worker, the
serving process itself) imports it. This module therefore does not import prometheus_client.
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def multiprocess_dir(configured: str) -> Iterator[Path]:
    """An empty directory for one run's metric files, as prometheus_client requires: ``configured``
    (PROMETHEUS_MULTIPROC_DIR) with the files of an earlier run removed, else a temporary directory
    removed at exit."""
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="genrank-metrics-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
