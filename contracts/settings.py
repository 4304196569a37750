"""Every configuration variable of genrank, in one place, with its local default.

Library code takes explicit arguments; the Dagster resources (assets/resources.py), the code location and the
command line read these. It lives in `contracts`, the layer below every package, so that the code location, the
assets and the production rehearsal (deploy/stack.py) read the one definition without importing upwards.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value in (None, "") else value


def genrank_home() -> Path:
    """GENRANK_HOME: root of all data (landing/, lake/, warehouse.duckdb, mlflow.db, ...)."""
    return Path(env("GENRANK_HOME", str(REPO_ROOT / ".genrank"))).resolve()


# name -> (default, meaning). tests/test_settings.py checks that the README's configuration table lists each.
VARIABLES: dict[str, tuple[str, str]] = {
    "GENRANK_HOME": ("./.genrank", "root of all data: landing/, lake/, warehouse.duckdb, mlflow.db, mlartifacts/, dagster_home/"),
    "GENRANK_START_DATE": ("the first complete landing day, else 2026-01-01; every `genrank` command pins it so the processes it starts agree", "first daily partition (read when the code location loads)"),
    "GENRANK_SPARK_MASTER": ("local[*]", "spark.master for the events job (any cluster URL works)"),
    "GENRANK_SPARK_DRIVER_MEMORY": ("1g", "spark.driver.memory (1g: a `large` day's events job as fast as with 2g, its driver 0.4-0.6 GB smaller; benchmarks/RESULTS.md)"),
    "GENRANK_SPARK_EXECUTOR_WAIT_S": ("300", "on a cluster master: seconds a Spark job may wait with no executor (its workers lost) before it is cancelled and the events step fails"),
    "GENRANK_ATTRIBUTION_WINDOW_MIN": ("60", "minutes after an impression within which a click is attributed to it"),
    "GENRANK_LATE_GRACE_HOURS": ("6", "how long the newest day waits for D+1's files before it is processed without them"),
    "GENRANK_TORCH_THREADS": ("0", "torch intra-op threads for training (0: every core the process may use; 1 where other work shares the cores, as the quality benchmarks do)"),
    "GENRANK_LATENCY_BUDGET_MS": ("50", "promotion gate: p99 scoring time of one request (CADET: p99 < 50 ms)"),
    "GENRANK_SENSOR_INTERVAL_S": ("30", "seconds between two evaluations of the landing sensor (it starts at most one daily run per evaluation)"),
    # read by models.kernels' dispatch (attn_backend, triton_blocks below), not by the pipeline
    "GENRANK_ATTN_BACKEND": ("auto", "interval-attention kernel: `auto` (Triton on CUDA, else the torch reference), `reference`, `prefix` or `triton`"),
    "GENRANK_TRITON_BLOCKS": ("(empty: 64,64,4)", "Triton kernel blocks `BM,BN,WARPS` on CUDA (benchmarking only)"),
    "MLFLOW_TRACKING_URI": ("sqlite:///$GENRANK_HOME/mlflow.db", "MLflow tracking and registry store"),
    "GENRANK_ONLINE_STORE": ("(empty: LMDB under $GENRANK_HOME/online_store)", "the online sequence store the `online_sequences` asset writes and `genrank serve` reads: empty for the embedded LMDB store, or a `redis://host:port/db` URL"),
    "GENRANK_SERVE_POLL_S": ("15", "`genrank serve`: seconds between checks of the champion alias and the sequence store"),
    "GENRANK_SERVE_THREADS": ("1", "`genrank serve`: onnxruntime intra-op threads per worker (0 = onnxruntime's default, the physical cores); scale out with `--workers`"),
    "GENRANK_SERVE_MAX_CANDIDATES": ("1000", "`genrank serve`: candidates per request"),
    "GENRANK_SERVE_MAX_HISTORY": ("20000", "`genrank serve`: inline history events per request"),
    "GENRANK_SERVE_MAX_BODY_BYTES": ("8388608", "`genrank serve`: request body size (413 above)"),
    "GENRANK_SERVE_PREDICTION_LOG": ("$GENRANK_HOME/prediction_log", "`genrank serve`: where every scored request is logged (JSON Lines, a `date=D` folder per day of the request's time); `off` logs nothing"),
    "GENRANK_SERVE_PREDICTION_LOG_MAX_MB": ("2048", "`genrank serve`: the prediction log's size bound: the oldest files are deleted beyond it (files rotate at 64 MiB)"),
    "PROMETHEUS_MULTIPROC_DIR": ("(empty: a temporary directory per `genrank serve` run)", "where the workers of `genrank serve` write their metrics for `/metrics` (prometheus_client's multiprocess mode); emptied at start"),
    "GENRANK_TRAIN_PROCS": ("1", "processes the student asset trains with: above 1 it launches `torchrun --nproc-per-node N` (DDP, gloo on CPU); `genrank stack` defaults it to 2"),
    "GENRANK_STACK_POSTGRES_PORT": ("15432", "`genrank stack`: PostgreSQL's port (127.0.0.1)"),
    "GENRANK_STACK_MLFLOW_PORT": ("15000", "`genrank stack`: the MLflow tracking server's port"),
    "GENRANK_STACK_SPARK_PORT": ("17077", "`genrank stack`: the Spark master's port (its web UI on +1, the worker's on +2)"),
    "GENRANK_STACK_DAGSTER_PORT": ("13000", "`genrank stack`: dagster-webserver's port"),
    "CI": ("(empty: not CI)", "`true` in CI (.ci/run sets it): a skipped test other than the CUDA ones fails the test run"),
}
# deploy.stack.Ports, in its field order
STACK_PORTS = ("GENRANK_STACK_POSTGRES_PORT", "GENRANK_STACK_MLFLOW_PORT", "GENRANK_STACK_SPARK_PORT",
               "GENRANK_STACK_DAGSTER_PORT")


DEFAULT_START_DATE = "2026-01-01"


def requested_start_date() -> str | None:
    """GENRANK_START_DATE as set in the environment, or None. The first daily partition itself is decided
    by assets.partitions.first_partition_day (this, else the first complete landing day, else the default)."""
    return env("GENRANK_START_DATE", "") or None


def start_date() -> str:
    """GENRANK_START_DATE, else the default first day (for a data root with no landing day yet)."""
    return requested_start_date() or DEFAULT_START_DATE


def spark_driver_memory() -> str:
    """GENRANK_SPARK_DRIVER_MEMORY: spark.driver.memory of the events job's driver."""
    return env("GENRANK_SPARK_DRIVER_MEMORY", VARIABLES["GENRANK_SPARK_DRIVER_MEMORY"][0])


def online_store() -> str:
    """GENRANK_ONLINE_STORE: empty for the embedded LMDB store, else a redis:// URL (deploy.sequence_store)."""
    return env("GENRANK_ONLINE_STORE", "")


def _number(name: str, kind: type):
    """A reader of the numeric variable ``name``, its docstring the variable's line of VARIABLES."""
    def read():
        return kind(env(name, VARIABLES[name][0]))

    read.__doc__ = f"{name}: {VARIABLES[name][1]}."
    return read


attribution_window_min = _number("GENRANK_ATTRIBUTION_WINDOW_MIN", float)
late_grace_hours = _number("GENRANK_LATE_GRACE_HOURS", float)
sensor_interval_s = _number("GENRANK_SENSOR_INTERVAL_S", int)   # read when the code location loads
latency_budget_ms = _number("GENRANK_LATENCY_BUDGET_MS", float)
train_procs = _number("GENRANK_TRAIN_PROCS", int)


def torch_threads() -> int:
    """GENRANK_TORCH_THREADS: torch's intra-op threads for training; 0 (the default) is every core this process may
    use. On 2 quiet cores two threads ran `make demo` 1.15x faster than one, the teacher 1.39x, with the same output
    (benchmarks/RESULTS.md, "Two torch threads, one dbt start less, the landing parsed once")."""
    threads = int(env("GENRANK_TORCH_THREADS", VARIABLES["GENRANK_TORCH_THREADS"][0]))
    if threads < 0:
        raise ValueError(f"GENRANK_TORCH_THREADS must be 0 (every core) or a positive count, got {threads}")
    return threads or len(os.sched_getaffinity(0))


def serve_prediction_log(home: Path) -> Path | None:
    """GENRANK_SERVE_PREDICTION_LOG: the prediction log's directory, None for `off`."""
    value = env("GENRANK_SERVE_PREDICTION_LOG", str(Path(home) / "prediction_log"))
    return None if value == "off" else Path(value).resolve()


def serve_prediction_log_max_bytes() -> int:
    """GENRANK_SERVE_PREDICTION_LOG_MAX_MB, in bytes."""
    return int(float(env("GENRANK_SERVE_PREDICTION_LOG_MAX_MB", VARIABLES["GENRANK_SERVE_PREDICTION_LOG_MAX_MB"][0])) * (1 << 20))


def prometheus_multiproc_dir() -> str:
    """PROMETHEUS_MULTIPROC_DIR: empty unless set (then `genrank serve` uses it instead of a temporary directory)."""
    return env("PROMETHEUS_MULTIPROC_DIR", "")


def attn_backend() -> str:
    """GENRANK_ATTN_BACKEND: the interval-attention kernel `auto` resolves to (models.kernels)."""
    return env("GENRANK_ATTN_BACKEND", VARIABLES["GENRANK_ATTN_BACKEND"][0])


def triton_blocks() -> tuple[int, int, int] | None:
    """GENRANK_TRITON_BLOCKS as (BM, BN, WARPS), None when unset."""
    value = env("GENRANK_TRITON_BLOCKS", "")
    return tuple(int(x) for x in value.split(",")) if value else None


# Variables of other tools' protocols, read here too so that nothing else reads the environment.
def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton runs kernels in its CPU interpreter (the kernels pick tiny blocks then)."""
    return env("TRITON_INTERPRET", "0") == "1"


def torchrun_world() -> tuple[int, int]:
    """(WORLD_SIZE, LOCAL_RANK) as torchrun sets them; (1, 0) in a plain process."""
    return int(env("WORLD_SIZE", "1")), int(env("LOCAL_RANK", "0"))


def java_home() -> str:
    """JAVA_HOME, empty when unset (Spark then takes the java on PATH)."""
    return env("JAVA_HOME", "")


def dagster_home() -> str:
    """DAGSTER_HOME, empty when unset (the runner then uses $GENRANK_HOME/dagster_home)."""
    return env("DAGSTER_HOME", "")


def ci() -> bool:
    """CI: `true` where the test suite runs as CI (tests/conftest.py lets only the CUDA tests skip there)."""
    return env("CI", "").lower() == "true"


def tracking_uri(home: Path) -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store under the data root."""
    return env("MLFLOW_TRACKING_URI", f"sqlite:///{Path(home) / 'mlflow.db'}")
