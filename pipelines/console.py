"""What `genrank run` / `genrank demo` show on the terminal: their own lines, and one live progress line
(day, stage, elapsed) while a day runs; the libraries' output (dbt, Spark, MLflow, Dagster, warnings)
goes to ``$GENRANK_HOME/logs/run-<timestamp>.log``, on the console only with ``-v``.

The redirection is at the file-descriptor level, so it also catches what subprocesses write (dbt, the
Spark JVM), which inherit the process's stdout and stderr.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path


class RunConsole:
    def __init__(self, home: Path, verbose: bool = False, log_name: str | None = None):
        """``log_name``: the file under $GENRANK_HOME/logs/ the libraries write to, appended to (default a
        new ``run-<timestamp>.log``, announced on the first line; a named log is not announced)."""
        self.verbose = verbose
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.log_path = Path(home) / "logs" / (log_name or f"run-{stamp}.log")
        self._announce = log_name is None
        self._saved: list[int] = []
        self._out = sys.stdout
        self._live = threading.Event()
        self._status = ""

    def __enter__(self) -> "RunConsole":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if not self.verbose:
            sys.stdout.flush()
            sys.stderr.flush()
            self._saved = [os.dup(1), os.dup(2)]
            self._out = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            logging.captureWarnings(True)
            warnings.simplefilter("default")
        if self._announce:
            self.print(f"Logs of dbt, Spark, MLflow and Dagster: {self.log_path}" + ("" if not self.verbose else " (and here: -v)"))
        return self

    def __exit__(self, *exc) -> None:
        self.stop_progress()
        if self._saved:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)
            for fd in self._saved:
                os.close(fd)
            self._saved = []
            self._out.close()
            self._out = sys.stdout

    def print(self, line: str = "") -> None:
        self._clear()
        print(line, file=self._out, flush=True)

    @contextlib.contextmanager
    def progress(self, label: str, stage_of):
        """A live line ``label  stage  elapsed`` on a terminal, refreshed every second from ``stage_of()``
        (the current step of the run), while the body runs. Nothing live when stdout is not a terminal."""
        if not self._out.isatty() or self.verbose:
            yield
            return
        started = time.monotonic()
        self._live.set()

        def refresh():
            while self._live.is_set():
                with contextlib.suppress(Exception):   # a transient read of the event log must not end the run
                    self._status = f"{label}  {stage_of() or 'starting'}  {time.monotonic() - started:4.0f}s"
                    self._out.write("\r\033[K" + self._status)
                    self._out.flush()
                time.sleep(1)

        thread = threading.Thread(target=refresh, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.stop_progress()
            thread.join(timeout=5)

    def stop_progress(self) -> None:
        self._live.clear()
        self._clear()

    def _clear(self) -> None:
        if self._status:
            self._out.write("\r\033[K")
            self._out.flush()
            self._status = ""
