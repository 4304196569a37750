"""The prediction log: every request the service scored, as JSON Lines, written off the request path.

Layout under its directory (``$GENRANK_HOME/prediction_log`` unless ``GENRANK_SERVE_PREDICTION_LOG``
names another)::

    date=YYYY-MM-DD/predictions-<pid>-<token>-<seq>.jsonl

The day is the UTC date of the request's time (``ts_ms``: the request's ``request_ts_ms``, else when
it arrived), so a replayed day lands in that day's folder. One line per scored request, built by the
service (deploy/service.py, ``score_body``)::

    request_id      the client's (a replay sends the landing's), else one the service made up and returned
    ts_ms           the request's time
    user_id         null for an inline history without a user
    history_source  "store" | "inline";  history_events: the events the model saw
    candidates      columns: {"ad_id": [...], "campaign_id": [...], ..., "device": [...]}
    model_version   the genrank-ctr version that scored it
    scores          per candidate, P(click | position bucket k) for each bucket
    store_as_of     the online store's day when it was scored
    latency_ms      body read to response built;  worker_pid: the worker that answered

Never blocking: a request hands its record to a bounded in-memory queue (``put_nowait``); one writer
thread per worker process serialises and appends. A full queue drops the record (reason
``queue_full``), a write that fails (disk full, permissions) drops its batch (``write_error``); both are
counted through ``on_drop`` (the service's metrics), never lost silently.

Several workers: each process writes only its own files (its pid and a random token in the name), whole
lines in one append at a time, so no two writers share a file and lines never interleave. A process
killed mid-write can leave a cut last line in its own file: a reader treats such a line as malformed.

Rotation and bound: a file is closed and the next one started once it holds ``file_bytes``. Whenever a
writer opens a file it deletes the oldest files (by modification time) of the whole directory until it
holds at most ``total_bytes``, skipping every file a writer still has open (each writer holds an
``flock`` on its open files), so the directory exceeds the bound by at most the files open at the time.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import queue
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from contracts import layout

log = logging.getLogger("genrank.serve.prediction_log")

QUEUE_FULL, WRITE_ERROR = "queue_full", "write_error"
FILE_GLOB = "date=*/predictions-*.jsonl"
_STOP = object()


@dataclass(frozen=True)
class LogLimits:
    queue_records: int = 10_000      # records waiting for the writer; beyond, a request's record is dropped
    file_bytes: int = 64 << 20       # a file is rotated once it holds this much
    total_bytes: int = 2 << 30       # the directory's bound (GENRANK_SERVE_PREDICTION_LOG_MAX_MB)
    batch_records: int = 256         # records appended per write
    open_days: int = 2               # day files a writer keeps open (today's and a replayed day's)


def day_of(ts_ms: int) -> str:
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.timezone.utc).date().isoformat()


class _OpenFile:
    def __init__(self, path: Path):
        self.path = path
        while True:  # a pruner may unlink a just-created file before it is locked: then create it again
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # waits only while a pruner holds it to delete it
            if os.fstat(self.fd).st_nlink > 0:
                break
            os.close(self.fd)
        self.size = os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.size += len(data)

    def close(self) -> None:
        os.close(self.fd)  # releases the flock: the file may now be pruned


class PredictionLog:
    """One worker's writer. ``submit`` never blocks; ``start`` runs the writer thread, ``close`` drains it."""

    def __init__(self, directory: Path, limits: LogLimits = LogLimits(),
                 on_drop: Callable[[str, int], None] = lambda reason, n: None,
                 on_write: Callable[[int], None] = lambda n: None):
        self.directory = Path(directory)
        self.limits = limits
        self._on_drop, self._on_write = on_drop, on_write
        self._queue: queue.Queue = queue.Queue(limits.queue_records)
        self._files: dict[str, _OpenFile] = {}  # day -> its open file, least recently written first
        self._name = f"predictions-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None

    def submit(self, record: dict) -> bool:
        """Queue a record for the writer; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self._on_drop(QUEUE_FULL, 1)
            return False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="genrank-prediction-log", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        """Wait until every record submitted so far is written or dropped (the writer must be running)."""
        self._queue.join()

    def close(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._queue.put(_STOP, timeout=timeout_s)
            self._thread.join(timeout_s)

    # ---------------------------------------------------------------------------------- writer thread

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < self.limits.batch_records:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            self._write([r for r in batch if r is not _STOP])
            for _ in batch:
                self._queue.task_done()
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _write(self, records: list[dict]) -> None:
        by_day: dict[str, list[bytes]] = {}
        for r in records:  # one dumps per record: the request threads get the GIL between two
            by_day.setdefault(day_of(r["ts_ms"]), []).append(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))
        for day, lines in by_day.items():
            try:
                self._file(day).append(b"".join(lines))
                self._on_write(len(lines))
                self._last_error = None
            except OSError as exc:
                self._on_drop(WRITE_ERROR, len(lines))
                if str(exc) != self._last_error:  # once per kind of failure, not once per batch
                    log.warning("prediction log: dropping records (counted in the metrics): %s", exc)
                self._last_error = str(exc)
                stale = self._files.pop(day, None)
                if stale is not None:
                    stale.close()

    def _file(self, day: str) -> _OpenFile:
        f = self._files.pop(day, None)
        if f is not None and f.size >= self.limits.file_bytes:
            f.close()
            f = None
        if f is None:
            folder = layout.day_dir(self.directory, day)
            folder.mkdir(parents=True, exist_ok=True)
            self._seq += 1
            f = _OpenFile(folder / f"{self._name}-{self._seq:05d}.jsonl")
            if len(self._files) >= self.limits.open_days:
                self._files.pop(next(iter(self._files))).close()
            prune(self.directory, self.limits.total_bytes)
        self._files[day] = f  # most recently written last
        return f


def prune(directory: Path, total_bytes: int) -> list[Path]:
    """Delete the oldest log files until the directory holds at most ``total_bytes``, skipping files a
    writer holds open; the deleted files."""
    files = []
    for path in directory.glob(FILE_GLOB):
        try:
            st = path.stat()
        except FileNotFoundError:  # another worker pruned it
            continue
        files.append((st.st_mtime, path, st.st_size))
    total = sum(size for _, _, size in files)
    deleted = []
    for _, path, size in sorted(files):
        if total <= total_bytes:
            break
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            total -= size
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a writer's current file
            continue
        else:
            path.unlink(missing_ok=True)
            total -= size
            deleted.append(path)
        finally:
            os.close(fd)
    return deleted


def read_day(directory: Path, day: str) -> list[dict]:
    """Every record of one day, in no particular order across workers (tests and tools; the monitor
    that quarantines cut lines reads the files itself)."""
    return [orjson.loads(line) for path in sorted(layout.day_dir(directory, day).glob("predictions-*.jsonl"))
            for line in path.read_bytes().splitlines() if line.strip()]
