"""Real Dagster services for the operating-mode tests: a dagster-daemon and a dagster-webserver on a
home of their own, bound to 127.0.0.1 on free ports, each ended by its own PID (PID file) even when the
test fails; the webserver's GraphQL API as the UI calls it; and Debian's headless Chromium."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import dagster as dg

from deploy import stack
from deploy.stack import BIN, REPO, free_port
from pipelines.runner import local_dagster_home

LOCATION = "genrank"


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


class DagsterStack:
    """dagster-daemon (and optionally dagster-webserver) on ``home``'s local instance, loading
    ``module`` (a file) as the code location ``genrank``."""

    def __init__(self, home: Path, module: Path, env: dict[str, str], webserver: bool):
        self.home = home
        self.dagster_home = local_dagster_home(home)
        # The instance's SQLite storages are created, and stamped with their schema head, here: the daemon
        # and the test opening a fresh instance at once can stamp two heads, and then nothing can open it.
        dg.DagsterInstance.from_config(str(self.dagster_home)).dispose()
        self.folder = home / "services"
        self.folder.mkdir(exist_ok=True)
        self.workspace = self.folder / "workspace.yaml"
        self.workspace.write_text(
            f"load_from:\n  - python_file:\n      relative_path: {module}\n      working_directory: {REPO}\n"
            f"      location_name: {LOCATION}\n")
        self.env = {**os.environ, **env, "GENRANK_HOME": str(home), "DAGSTER_HOME": str(self.dagster_home)}
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.services: list[Service] = []
        self.url = None
        try:
            self.services.append(Service("dagster-daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(self.workspace)],
                                         self.env, self.folder))
            if webserver:
                port = free_port()
                self.url = f"http://127.0.0.1:{port}"
                self.services.append(Service("dagster-webserver", [str(BIN / "dagster-webserver"), "-w", str(self.workspace),
                                                                   "-h", "127.0.0.1", "-p", str(port)], self.env, self.folder))
                self._wait_for_webserver()
        except BaseException:
            self.stop()
            raise

    def _wait_for_webserver(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                data = self.graphql("{ workspaceOrError { ... on Workspace { locationEntries { name "
                                    "locationOrLoadError { __typename } } } } }")
                entries = data["workspaceOrError"]["locationEntries"]
                if entries and entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation":
                    return
            time.sleep(2)
        raise TimeoutError(f"dagster-webserver did not load the code location: {self.services[-1].tail()}")

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        assert "errors" not in body, body["errors"]
        return body["data"]

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
        self.services = []

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.tail()}" for s in self.services)


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
