"""What the operating-mode tests start and look through: a service process (an MLflow server, `genrank serve`) ended
by its own PID (PID file) even when the test fails, and Debian's headless Chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from deploy import stack


class Service:
    """One started process, stopped by its PID file (never by name): deploy.stack.Service's process handling
    (its own session, a PID file with the kernel start time, SIGTERM to the group then SIGKILL, whatever its
    session leaves behind) for a fixed command. It dies with the test process (PR_SET_PDEATHSIG), even when
    that is killed before its finally blocks run (a timeout, a kill -9), so no service outlives its test."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], folder: Path):
        self.name, self.folder, self.log = name, folder, folder / f"{name}.log"
        self.process = stack.Service(name, [], lambda: cmd, ready=lambda: True)
        self.proc = self.process.launch(folder, env, self.log, die_with_parent=True)

    def wait_ready(self, url: str, timeout_s: float) -> None:
        """Until ``url`` answers 200; a TimeoutError with the log's tail when the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not answer {url}: {self.tail()}")

    def stop(self) -> None:
        self.process.stop(self.folder, timeout_s=30)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (Playwright's own download does not work here)."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("chromium is missing and the test is not root: apt-get install -y chromium")
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, timeout=1200,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("chromium")


def browse(url: str, screenshot: Path, budget_ms: int = 20000) -> str:
    """The page's DOM after its scripts ran (headless Chromium), and a screenshot of it."""
    common = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", f"--virtual-time-budget={budget_ms}", "--window-size=1600,1000"]
    subprocess.run([*common, f"--screenshot={screenshot}", url], check=True, capture_output=True, timeout=180)
    return subprocess.run([*common, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=180).stdout
