"""The production rehearsal on one machine: `genrank stack up|down|status` (`make prod-up` / `make prod-down`).

Brings up, bound to 127.0.0.1, with state, logs and PID files under ``$GENRANK_HOME/stack/``:

- **postgres**: a private cluster of Debian's PostgreSQL (``initdb`` once, then ``postgres -D``), the
  storage of the Dagster instance (database ``dagster``) and of the MLflow server (database ``mlflow``);
  password authentication, the password in ``stack/postgres.password``. PostgreSQL refuses to run as
  root: a root caller runs it as the package's ``postgres`` user (the data folder is chowned to it).
- **mlflow**: ``mlflow server --serve-artifacts``: the registry in Postgres, artifacts proxied by the
  server into ``stack/mlartifacts`` (clients only see ``mlflow-artifacts:`` URIs).
- **spark-master** and **spark-worker**: Spark standalone from the pyspark package's ``bin/spark-class``
  (the pip package has no ``sbin/start-master.sh``).
- **dagster-webserver** and **dagster-daemon**: the instance ``stack/dagster_home/dagster.yaml``, which is
  ``deploy/dagster.yaml`` (the production truth) with the one rehearsal change, :func:`instance_config`.

Every process is started in its own session with a PID file holding its PID and kernel start time, and
is stopped only through that file (a PID reused by another process is never signalled), together with
what its session left behind when it died (a code server of a killed daemon: :meth:`Service.stop`).
``up`` is idempotent: what runs is reported and left alone. The pipeline processes (the daemon's runs,
``genrank serve``) get :func:`pipeline_env`; ``genrank stack env`` prints it for a shell, with the
stack's ``GENRANK_START_DATE`` (:meth:`Stack.start_date`). The tests start their own services with
:class:`Service` too (tests/operating/services.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from contracts import settings
from transforms import landing

REPO = settings.REPO_ROOT
BIN = Path(sys.executable).parent
DEPLOY_INSTANCE = REPO / "deploy" / "dagster.yaml"
PG_USER, PG_DATABASES = "genrank", ("dagster", "mlflow")
PR_SET_PDEATHSIG = 1   # linux/prctl.h
# In the environment of every process a Service starts, inherited by its children: what tells `down` that
# a process left in a service's session after its leader died is one of ours.
SERVICE_MARKER = "GENRANK_SERVICE"


@dataclass(frozen=True)
class Ports:
    postgres: int
    mlflow: int
    spark: int          # the master's RPC port; its web UI listens on spark + 1, the worker's on spark + 2
    dagster: int

    @classmethod
    def from_settings(cls) -> "Ports":
        return cls(*(int(settings.env(name, settings.VARIABLES[name][0])) for name in settings.STACK_PORTS))

    @classmethod
    def free(cls) -> "Ports":
        """Ports nobody listens on now (Spark's with its two web UIs after it): a rehearsal beside another."""
        for _ in range(50):
            spark = free_port()
            if spark + 2 < 65536 and not any(_port_open(spark + i) for i in (1, 2)):
                return cls(free_port(), free_port(), spark, free_port())
        raise RuntimeError("no three consecutive free ports for Spark")


def free_port() -> int:
    """A port the kernel has just found free on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    home: Path
    ports: Ports = field(default_factory=Ports.from_settings)
    env: dict[str, str] = field(default_factory=dict)   # more variables for the pipeline processes
    workspace: Path = REPO / "workspace.yaml"   # the code locations dagster-webserver and dagster-daemon load

    @property
    def folder(self) -> Path:
        return self.home / "stack"

    # what the stack keeps under its folder
    dagster_home = property(lambda self: self.folder / "dagster_home")
    pg_data = property(lambda self: self.folder / "postgres")
    password_file = property(lambda self: self.folder / "postgres.password")
    start_date_file = property(lambda self: self.folder / "start_date")

    def password(self) -> str:
        if not self.password_file.exists():
            raise ValueError(f"no stack under {self.folder}: `genrank stack up --home {self.home}` first")
        return self.password_file.read_text().strip()

    def start_date(self) -> str:
        """GENRANK_START_DATE of every process of the stack. The code location's first daily partition must be
        one in the daemon, the webserver and the `genrank` commands of a `genrank stack env` shell (each command
        would otherwise pin its own from the landing zone, pipelines.runner.prepare_code_location), so it is
        decided by that same rule (the caller's setting, else the first complete landing day, else the default)
        when the Dagster services start, and recorded in ``stack/start_date`` for as long as they run."""
        if self.start_date_file.exists():
            return self.start_date_file.read_text().strip()
        return self._requested_start_date() or next(iter(landing.complete_days(self.home)), settings.start_date())

    def _requested_start_date(self) -> str | None:
        return self.env.get("GENRANK_START_DATE") or settings.requested_start_date()

    def _pin_start_date(self, dagster_running: bool) -> None:
        requested = self._requested_start_date()
        if dagster_running:
            if requested is not None and requested != self.start_date():
                raise ValueError(f"the stack's Dagster services run with GENRANK_START_DATE={self.start_date()} "
                                 f"({self.start_date_file}), not {requested}: `genrank stack down` first to change it")
            return
        self.start_date_file.unlink(missing_ok=True)
        date = self.start_date()
        try:
            dt.date.fromisoformat(date)
        except ValueError:
            raise ValueError(f"GENRANK_START_DATE={date!r} is not an ISO date (YYYY-MM-DD)") from None
        self.start_date_file.write_text(date)

    def pg_uri(self, db: str, scheme: str = "postgresql") -> str:
        return f"{scheme}://{PG_USER}:{self.password()}@127.0.0.1:{self.ports.postgres}/{db}"

    def pipeline_env(self) -> dict[str, str]:
        """The variables every pipeline process of the stack runs with (besides the caller's)."""
        return {
            "GENRANK_HOME": str(self.home),
            "DAGSTER_HOME": str(self.dagster_home),
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_USER": PG_USER,
            "DAGSTER_PG_PASSWORD": self.password(),
            "DAGSTER_PG_DB": "dagster",
            "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{self.ports.mlflow}",
            "GENRANK_SPARK_MASTER": f"spark://127.0.0.1:{self.ports.spark}",
            "GENRANK_START_DATE": self.start_date(),
            "GENRANK_TRAIN_PROCS": settings.env("GENRANK_TRAIN_PROCS", "2"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "MLFLOW_ENABLE_TELEMETRY": "false",
            "DAGSTER_DISABLE_TELEMETRY": "true",
            "GX_ANALYTICS_ENABLED": "false",
            **self.env,
        }

    # ------------------------------------------------------------------------------------ services

    def services(self) -> list["Service"]:
        """In start order; stopped in reverse."""
        p, spark_home = self.ports, _spark_home()
        spark_env = {"SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(self.folder / "logs"),
                     "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1",
                     # no REST submission server (fixed port 6066): applications connect over the master port
                     "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        spark_class = str(Path(spark_home) / "bin" / "spark-class")
        workspace = str(self.workspace)
        return [
            Service("postgres", [p.postgres], self._postgres_cmd, self._postgres_ready, stop_signal=signal.SIGINT,
                    group=False, prepare=self._postgres_prepare, after=self._postgres_databases, user=_pg_user()),
            Service("mlflow", [p.mlflow], lambda: [
                str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(p.mlflow), "--workers", "1",
                "--backend-store-uri", self.pg_uri("mlflow", "postgresql+psycopg2"), "--serve-artifacts",
                "--artifacts-destination", (self.folder / "mlartifacts").resolve().as_uri()],
                lambda: _http_ok(f"http://127.0.0.1:{p.mlflow}/health")),
            Service("spark-master", [p.spark, p.spark + 1], lambda: [
                spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(p.spark),
                "--webui-port", str(p.spark + 1)], lambda: _port_open(p.spark), env=spark_env),
            Service("spark-worker", [p.spark + 2], lambda: [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port",
                str(p.spark + 2), "--cores", "2", "--memory", "2g", "--work-dir", str(self.folder / "spark-work"),
                f"spark://127.0.0.1:{p.spark}"], self._spark_worker_registered, env=spark_env),
            Service("dagster-webserver", [p.dagster], lambda: [
                str(BIN / "dagster-webserver"), "-w", workspace, "-h", "127.0.0.1", "-p", str(p.dagster)],
                self._webserver_loaded, prepare=self._write_instance),
            Service("dagster-daemon", [], lambda: [str(BIN / "dagster-daemon"), "run", "-w", workspace],
                    lambda: True, prepare=self._write_instance),
        ]

    def up(self, die_with_parent: bool = False, log: Callable[[str], None] = print) -> dict[str, float]:
        """Starts what is not running; returns the seconds each started service took to become ready."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "logs").mkdir(exist_ok=True)
        if not self.password_file.exists():
            self.password_file.write_text(secrets.token_hex(16))
            self.password_file.chmod(0o600)
        services = self.services()
        self._pin_start_date(any(s.running_pid(self.folder) for s in services if s.name.startswith("dagster-")))
        timings: dict[str, float] = {}
        for service in services:
            pid = service.running_pid(self.folder)
            if pid is not None:
                log(f"{service.name}: already up (pid {pid})")
                continue
            started = time.monotonic()
            service.start(self, die_with_parent)
            timings[service.name] = time.monotonic() - started
            log(f"{service.name}: up in {timings[service.name]:.1f} s ({service.describe(self)})")
        return timings

    def down(self, log: Callable[[str], None] = print) -> list[str]:
        """Stops every service this stack's PID files name (and what their sessions left), newest first;
        returns their names."""
        stopped = []
        for service in reversed(self.services()):
            if service.stop(self.folder):
                stopped.append(service.name)
                log(f"{service.name}: stopped")
        return stopped

    def status(self) -> dict[str, int | None]:
        return {s.name: s.running_pid(self.folder) for s in self.services()}

    # ------------------------------------------------------------------------------------ postgres

    def _postgres_prepare(self) -> None:
        user = _pg_user()
        if (self.pg_data / "PG_VERSION").exists():
            return
        initdb = _pg_binary("initdb")
        self.pg_data.mkdir(parents=True, exist_ok=True)
        pwfile = self.folder / "postgres.initdb-password"
        pwfile.write_text(self.password() + "\n")
        try:
            if user is not None:
                entry = pwd.getpwnam(user)
                for path in (self.pg_data, pwfile):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
                self.pg_data.chmod(0o700)
                probe = subprocess.run(["test", "-w", str(self.pg_data)], user=user)
                if probe.returncode != 0:
                    raise ValueError(f"PostgreSQL runs as the user {user!r} (it refuses root), who cannot reach "
                                     f"{self.pg_data}: give GENRANK_HOME a path every user can traverse")
            subprocess.run([initdb, "-D", str(self.pg_data), "-U", PG_USER, f"--pwfile={pwfile}",
                            "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"], user=user, check=True,
                           capture_output=True, text=True)
        finally:
            pwfile.unlink()

    def _postgres_cmd(self) -> list[str]:
        return [_pg_binary("postgres"), "-D", str(self.pg_data), "-p", str(self.ports.postgres),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]

    def _postgres_ready(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.pg_uri("postgres"), connect_timeout=3).close()
            return True
        except psycopg2.OperationalError:
            return False

    def _postgres_databases(self) -> None:
        import psycopg2

        conn = psycopg2.connect(self.pg_uri("postgres"))
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for db in PG_DATABASES:
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                    if cur.fetchone() is None:
                        cur.execute(f'CREATE DATABASE "{db}"')
        finally:
            conn.close()

    # ------------------------------------------------------------------------------------ spark, dagster

    def _spark_worker_registered(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.spark + 1}/json/", timeout=5) as response:
                return json.loads(response.read()).get("aliveworkers", 0) >= 1
        return False

    def _write_instance(self) -> None:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        target = self.dagster_home / "dagster.yaml"
        text = ("# Written by `genrank stack up` from deploy/dagster.yaml (deploy/stack.py instance_config): "
                "do not edit.\n" + yaml.safe_dump(instance_config(self.ports.postgres), sort_keys=False))
        if not target.exists() or target.read_text() != text:
            target.write_text(text)

    def _webserver_loaded(self) -> bool:
        query = ("{ workspaceOrError { ... on Workspace { locationEntries { "
                 "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports.dagster}/graphql",
                                         data=json.dumps({"query": query}).encode(),
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                entries = json.loads(response.read())["data"]["workspaceOrError"]["locationEntries"]
        except (OSError, KeyError, TypeError, ValueError):
            return False
        loaded = [e["locationOrLoadError"] for e in entries if e["locationOrLoadError"]]
        errors = [e.get("message", "") for e in loaded if e["__typename"] == "PythonError"]
        if errors:
            raise RuntimeError(f"the code location failed to load: {errors[0][:2000]}")
        return bool(loaded)


def instance_config(postgres_port: int) -> dict:
    """deploy/dagster.yaml with the rehearsal's one change, decided here: no Docker daemon on this machine,
    so the run launcher is Dagster's default (a run is a subprocess of the daemon's code server) instead of
    DockerRunLauncher; Postgres listens on the stack's port. Storage, queue, pools, retries and run
    monitoring are production's."""
    config = yaml.safe_load(DEPLOY_INSTANCE.read_text())
    config.pop("run_launcher")
    config["storage"]["postgres"]["postgres_db"]["port"] = postgres_port
    return config


@dataclass
class Service:
    name: str
    ports: list[int]
    command: Callable[[], list[str]]
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    stop_signal: int = signal.SIGTERM
    group: bool = True            # signal the whole process group (children such as Spark executors, run workers)
    prepare: Callable[[], None] | None = None
    after: Callable[[], None] | None = None
    user: str | None = None       # run as this user (PostgreSQL under root)
    timeout_s: float = 300

    def pid_file(self, folder: Path) -> Path:
        return folder / f"{self.name}.pid"

    def marker(self, folder: Path) -> str:
        return f"{folder.resolve()}/{self.name}"

    def describe(self, stack: Stack) -> str:
        ports = ", ".join(f"127.0.0.1:{p}" for p in self.ports) or "no port"
        return f"{ports}; log {stack.folder / 'logs' / f'{self.name}.log'}"

    def recorded(self, folder: Path) -> tuple[int, int] | None:
        """(PID, kernel start time) of the process this service's PID file names, running or not."""
        path = self.pid_file(folder)
        if not path.exists():
            return None
        pid, start = (int(x) for x in path.read_text().split())
        return pid, start

    def running_pid(self, folder: Path) -> int | None:
        """The PID of the process this stack started, if it still runs (same PID and kernel start time)."""
        recorded = self.recorded(folder)
        return recorded[0] if recorded is not None and _start_time(recorded[0]) == recorded[1] else None

    def launch(self, folder: Path, env: dict[str, str], log_path: Path, die_with_parent: bool) -> subprocess.Popen:
        """Runs the command in a session of its own with ``env`` (the whole environment) and the marker, its
        output appended to ``log_path``, and writes the PID file into ``folder``; does not wait."""
        as_user = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(self.command(), env={**env, SERVICE_MARKER: self.marker(folder)}, cwd=REPO,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, **as_user,
                                    preexec_fn=_die_with_parent if die_with_parent else None)
        self.pid_file(folder).write_text(f"{proc.pid} {_start_time(proc.pid)}")
        return proc

    def start(self, stack: Stack, die_with_parent: bool) -> None:
        self.stop(stack.folder)   # its leader is gone: what its session left behind goes too
        for port in self.ports:
            if _port_open(port):
                raise ValueError(f"port {port} is in use: {self.name} cannot bind 127.0.0.1:{port} "
                                 f"(set {_port_variable(self.name)} to a free port)")
        if self.prepare is not None:
            self.prepare()
        log_path = stack.folder / "logs" / f"{self.name}.log"
        proc = self.launch(stack.folder, {**os.environ, **stack.pipeline_env(), **self.env}, log_path, die_with_parent)
        deadline = time.monotonic() + self.timeout_s
        try:
            while not self.ready():
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {proc.returncode}: {_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} was not ready after {self.timeout_s:.0f} s: {_tail(log_path)}")
                time.sleep(1)
            if self.after is not None:
                self.after()
        except BaseException:
            self.stop(stack.folder)
            raise

    def stop(self, folder: Path, timeout_s: float = 60) -> bool:
        """Stops the process of this service's PID file (its group, for group services), then whatever its
        session still holds: when a leader dies without stopping its children (a killed dagster-daemon's code
        server and runs, a killed worker's executors) they stay in its session, whose id is the leader's PID
        (the kernel does not reuse it while they live), and carry the service's marker. False if none ran."""
        recorded = self.recorded(folder)
        if recorded is None:
            return False
        pid, started = recorded
        signalled = False
        if _start_time(pid) == started:
            kill = os.killpg if self.group else os.kill
            _terminate([pid], kill, self.stop_signal, timeout_s)
            signalled = True
        orphans = _session_members(pid, f"{SERVICE_MARKER}={self.marker(folder)}")
        if orphans:
            _terminate(orphans, os.kill, signal.SIGTERM, timeout_s)
        self.pid_file(folder).unlink(missing_ok=True)
        return signalled or bool(orphans)


# ---------------------------------------------------------------------------------------- helpers

def _port_variable(service: str) -> str:
    return {"postgres": "GENRANK_STACK_POSTGRES_PORT", "mlflow": "GENRANK_STACK_MLFLOW_PORT",
            "dagster-webserver": "GENRANK_STACK_DAGSTER_PORT"}.get(service, "GENRANK_STACK_SPARK_PORT")


def _spark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)


def _pg_user() -> str | None:
    """PostgreSQL refuses to run as root: root runs it as the Debian package's postgres user."""
    return "postgres" if os.geteuid() == 0 else None


def _pg_binary(name: str) -> str:
    """A PostgreSQL server binary; Debian's postgresql package is installed when missing."""
    def find() -> str | None:
        versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
        return str(versions[-1]) if versions else shutil.which(name)

    found = find()
    if found is None:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
            subprocess.run(sudo + cmd, check=True, capture_output=True, env=env, timeout=1200)
        found = find()
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is missing and apt-get could not install it: "
                           "apt-get install postgresql, then rerun")
    return found


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _start_time(pid: int) -> int | None:
    """The kernel's start time of a live process (field 22 of /proc/PID/stat), None if none or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def _terminate(pids: list[int], kill: Callable[[int, int], None], sig: int, timeout_s: float) -> None:
    """``sig`` to each, SIGKILL to those still alive after ``timeout_s``."""
    for escalation, wait_s in ((sig, timeout_s), (signal.SIGKILL, 30)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                kill(pid, escalation)
        pids = [pid for pid in pids if not _wait_gone(pid, wait_s)]
        if not pids:
            return


def _session_members(session: int, marker: str) -> list[int]:
    """Live processes of the session ``session`` whose environment holds ``marker`` (KEY=value)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text()
            fields = fields[fields.rindex(")") + 2:].split()
            if fields[0] == "Z" or int(fields[3]) != session:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue   # gone meanwhile, or another user's
        if marker.encode() in environ:
            members.append(int(stat.parent.name))
    return members


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)    # reap it when this process started it
        if _start_time(pid) is None:
            return True
        time.sleep(0.2)
    return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(url: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    return False


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]
