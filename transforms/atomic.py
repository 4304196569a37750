"""Atomic writes: a partition (or a file) is either the old version or the new one, never half.

A writer fills a hidden staging directory beside the target; on success the old directory is moved
aside, the staging directory renamed into place and the old one deleted. A crash leaves the old
version (or nothing) plus a hidden ``.tmp-*`` directory that readers never glob. Relies on POSIX
rename within one filesystem (local disk, HDFS-like stores). It imports nothing of genrank, so models/ and
deploy/ write through it too instead of keeping temp-then-rename twins.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def replace_dir(staging: Path, final: Path) -> None:
    if final.exists():
        old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(final)


@contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yield a staging directory that replaces ``final`` whole when the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, final)


@contextmanager
def staged_file(final: Path) -> Iterator[Path]:
    """Yield a hidden path beside ``final`` to write; it replaces ``final`` when the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    os.replace(staging, final)
