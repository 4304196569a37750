"""The ``genrank`` command: simulate or import raw logs, run the daily pipeline, print what happened."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from contracts import layout, settings


def world_config(preset: str, strengths: str | None = None, users: int | None = None, days: int | None = None,
                 bias_logit: float | None = None, shift_day: str | None = None):
    """The preset's WorldConfig with the `simulate` options applied. ``strengths`` is
    ``name=value,...`` over the fields of transforms.simulator.world.Strengths (the click-logit effects)."""
    import dataclasses

    from transforms.simulator import resolve_config
    from transforms.simulator.world import Strengths

    cfg = resolve_config(preset)
    known = {f.name for f in dataclasses.fields(Strengths)}
    changes: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in (strengths or "").split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"--strengths: {item!r} is not NAME=VALUE with NAME one of {', '.join(sorted(known))}")
        try:
            changes[name] = float(value)
        except ValueError:
            raise ValueError(f"--strengths: {name}={value!r} is not a number") from None
    sizes = {k: v for k, v in {"n_users": users, "n_days": days, "bias_logit": bias_logit}.items() if v is not None}
    if any(v < 1 for k, v in sizes.items() if k != "bias_logit"):
        raise ValueError("--users and --days must be at least 1")
    # a shift day is checked against the simulated days by simulate()
    return dataclasses.replace(cfg, strengths=dataclasses.replace(cfg.strengths, **changes), shift_day=shift_day,
                               **sizes)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from transforms.simulator import simulate

    config = world_config(args.preset, args.strengths, args.users, args.days, args.bias_logit, args.shift_day)
    report = simulate(preset=args.preset, seed=args.seed, out=args.out, config=config)
    print(report.summary())
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from transforms.importers import import_dataset

    options = {k: v for k, v in {
        "since": args.since, "until": args.until, "fill_gaps": args.fill_gaps or None,
        "policy": args.policy, "campaigns": args.campaigns, "fmt": args.format,
        "history": False if args.no_history else None,
    }.items() if v is not None}
    report = import_dataset(args.dataset, Path(args.src), Path(args.out), limit_users=args.limit_users, **options)
    print(report.summary())
    return 0 if report.reconciled else 1


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines.runner import run_days

    os.environ["GENRANK_HOME"] = str(Path(args.home).resolve())
    return 0 if run_days(args.start, args.end, teacher_every_days=args.teacher_every_days, verbose=args.verbose).ok else 1


def _cmd_landing_quarantine_file(args: argparse.Namespace) -> int:
    from transforms import landing

    entry = landing.quarantine_file(Path(args.home), Path(args.path), args.reason)
    print(f"moved {args.path} to {Path(args.home) / entry['moved_to']} ({entry['declared_lines']} declared lines); "
          f"ledger: {landing.quarantine_ledger_path(Path(args.home))}. Resume with: genrank run --start {entry['day']}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.runner import run_days
    from transforms.simulator import simulate

    home = Path(args.home).resolve()
    os.environ["GENRANK_HOME"] = str(home)
    print(simulate(preset=args.preset, seed=args.seed, out=home).summary(), flush=True)
    return 0 if run_days(None, None, teacher_every_days=args.teacher_every_days, verbose=args.verbose).ok else 1


def _cmd_status(args: argparse.Namespace) -> int:
    import contextlib

    from pipelines.console import RunConsole
    from pipelines.status import status

    home = Path(args.home).resolve()
    # MLflow and alembic log at INFO when they open a new registry: to logs/status.log, as `genrank run` does
    # (a folder without a landing zone gets its one line and no logs folder)
    with RunConsole(home, log_name="status.log") if layout.landing(home).is_dir() else contextlib.nullcontext():
        report, code = status(home)
    print(report)
    return code


def _cmd_rollback(args: argparse.Namespace) -> int:
    from deploy.registry import CTR, default_registry

    demoted, restored = default_registry(Path(args.home).resolve()).rollback(CTR)
    print(f"{CTR}: champion moved back from v{demoted} to v{restored} (v{demoted} is tagged rolled_back_at)")
    return 0


def _cmd_stack(args: argparse.Namespace) -> int:
    from deploy.stack import Stack

    stack = Stack(Path(args.home).resolve())
    if args.action == "up":
        started = time.monotonic()
        timings = stack.up()
        print(f"stack up under {stack.folder}: started {len(timings)} service(s) in {time.monotonic() - started:.1f} s; "
              f"dagster-webserver http://127.0.0.1:{stack.ports.dagster}, MLflow http://127.0.0.1:{stack.ports.mlflow}; "
              f"for a shell: eval \"$(genrank stack env --home {stack.home})\"")
    elif args.action == "down":
        print(f"stopped {len(stack.down())} service(s) of {stack.folder}")
    elif args.action == "env":
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in stack.pipeline_env().items()))
    else:
        status = stack.status()
        for name, pid in status.items():
            print(f"{name}: {'up (pid %d)' % pid if pid else 'down'}")
        return 0 if all(status.values()) else 1
    return 0


def serve_app():
    """The scoring app as the GENRANK_* variables configure it: uvicorn's factory in every worker process."""
    from deploy.prediction_log import LogLimits
    from deploy.service import ServiceConfig, create_app

    home = settings.genrank_home()
    d = ServiceConfig  # its defaults are the local defaults of the GENRANK_SERVE_* variables
    metrics_dir = settings.prometheus_multiproc_dir()  # exported by _cmd_serve
    return create_app(ServiceConfig(
        home=home, tracking_uri=settings.tracking_uri(home), store=settings.online_store(),
        poll_s=float(settings.env("GENRANK_SERVE_POLL_S", str(d.poll_s))),
        threads=int(settings.env("GENRANK_SERVE_THREADS", str(d.threads))),
        max_candidates=int(settings.env("GENRANK_SERVE_MAX_CANDIDATES", str(d.max_candidates))),
        max_history=int(settings.env("GENRANK_SERVE_MAX_HISTORY", str(d.max_history))),
        max_body_bytes=int(settings.env("GENRANK_SERVE_MAX_BODY_BYTES", str(d.max_body_bytes))),
        prediction_log=settings.serve_prediction_log(home),
        prediction_log_limits=LogLimits(total_bytes=settings.serve_prediction_log_max_bytes()),
        metrics_dir=Path(metrics_dir) if metrics_dir else None))


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from deploy.metrics_dir import multiprocess_dir

    # Worker processes build their app from the environment: hand --home to them there, and the directory
    # their metrics are summed through (before any of them imports prometheus_client).
    os.environ["GENRANK_HOME"] = str(Path(args.home).resolve())
    with multiprocess_dir(settings.prometheus_multiproc_dir()) as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        uvicorn.run("pipelines.cli:serve_app", factory=True, host=args.host, port=args.port, workers=args.workers,
                    log_level="info")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from deploy.replay import replay

    report = replay(Path(args.home).resolve(), args.day, args.url, max_requests=args.max_requests,
                    max_seconds=args.max_seconds, concurrency=args.concurrency, allow_remote=args.allow_remote)
    print(report.summary())
    return 1 if report.count(500, 600) or None in report.statuses else 0


def _cmd_ui(args: argparse.Namespace) -> int:
    """`dagster dev` on the instance `genrank run` records into (unless DAGSTER_HOME is set), so the UI
    shows those runs and the daemon runs the schedules, the landing sensor and run retries."""
    from pipelines.runner import local_dagster_home, prepare_code_location

    home = Path(args.home).resolve()
    prepare_code_location(home)
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", str(local_dagster_home(home)))
    env["GENRANK_HOME"] = str(home)
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [str(dagster if dagster.exists() else "dagster"), "dev", "-w", str(settings.REPO_ROOT / "workspace.yaml"),
           "--port", str(args.port)]
    print(f"DAGSTER_HOME={env['DAGSTER_HOME']} {' '.join(cmd)}", flush=True)
    os.execvpe(cmd[0], cmd, env)


def build_parser() -> argparse.ArgumentParser:
    home = str(settings.genrank_home())
    parser = argparse.ArgumentParser(prog="genrank", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="write a simulated world's landing zone, oracle and defect manifest")
    p.add_argument("--preset", default="demo", help="tiny | demo | sequence | large (default demo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=home, help="data root to write into (default GENRANK_HOME)")
    p.add_argument("--strengths", default=None,
                   help="click-logit effects, NAME=VALUE,... over long_term, session, session_decay_min, long_range, "
                        "long_range_half_life_days, quality, position_bias, repeat, complement, "
                        "complement_half_life_hours, abandonment, abandonment_half_life_hours (e.g. "
                        "session=1.5,complement=1); 0 turns an effect off")
    p.add_argument("--users", type=int, default=None, help="number of users (default: the preset's)")
    p.add_argument("--days", type=int, default=None, help="number of days (default: the preset's)")
    p.add_argument("--bias-logit", type=float, default=None,
                   help="the click logit's intercept, which sets the base rate (default: the preset's, -4.6)")
    p.add_argument("--shift-day", default=None, metavar="YYYY-MM-DD",
                   help="from this simulated day on the world drifts: a few categories trend and every ad shown "
                        "comes from a new pool (what serving_monitor's drift check must catch on that day)")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("import", help="convert a real public dataset into the landing format")
    p.add_argument("dataset", help="movielens | mind | ebnerd | obd")
    p.add_argument("--src", required=True, help="the dataset's folder")
    p.add_argument("--out", default=home, help="data root to write into (default GENRANK_HOME)")
    p.add_argument("--limit-users", type=int, default=None, help="take only the first N users (a slice)")
    p.add_argument("--since", help="first UTC day to land (YYYY-MM-DD); earlier rows are counted as dropped")
    p.add_argument("--until", help="last UTC day to land")
    p.add_argument("--fill-gaps", action="store_true", help="also land empty days so partitions are contiguous")
    p.add_argument("--policy", help="obd: random (default, unbiased positions) or bts")
    p.add_argument("--campaigns", help="obd: comma-separated subset of all,men,women")
    p.add_argument("--format", help="ebnerd: auto (default), parquet or tsv")
    p.add_argument("--no-history", action="store_true", help="mind: leave the untimed click histories out")
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("run", help="materialise the daily pipeline for every complete landing day (or a range)")
    p.add_argument("--home", default=home)
    p.add_argument("--start", default=None, help="first day (YYYY-MM-DD); default the first landing day")
    p.add_argument("--end", default=None, help="last day; default the last landing day")
    p.add_argument("-v", "--verbose", action="store_true", help="show dbt, Spark, MLflow and Dagster logs on the console too")
    p.add_argument("--teacher-every-days", type=int, default=7,
                   help="retrain the teacher every N days after the first (default 7, like the weekly schedule)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("landing", help="operator tools for landing days")
    landing_sub = p.add_subparsers(dest="landing_command", required=True)
    q = landing_sub.add_parser("quarantine-file", help="move a corrupt landing file out of its day into "
                               "lake/quarantine_files/ with a ledger entry, releasing the day")
    q.add_argument("path", help="the landing file, e.g. $GENRANK_HOME/landing/date=D/clicks-00000.jsonl.gz")
    q.add_argument("--reason", required=True, help="why (kept in the ledger and reported by the day's accounting)")
    q.add_argument("--home", default=home)
    q.set_defaults(func=_cmd_landing_quarantine_file)

    p = sub.add_parser("demo", help="simulate a world and run the daily pipeline over all its days")
    p.add_argument("--home", default=home)
    p.add_argument("--preset", default="demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true", help="show dbt, Spark, MLflow and Dagster logs on the console too")
    p.add_argument("--teacher-every-days", type=int, default=3,
                   help="teacher retrain cadence (default 3: the 8-day demo compresses the weekly cadence so it "
                        "shows a retrain over a longer window)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("serve", help="score requests with the genrank-ctr champion (ONNX, onnxruntime) over HTTP")
    p.add_argument("--home", default=home)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1,
                   help="server processes, each with its own onnxruntime session (one per core with GENRANK_SERVE_THREADS=1)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("replay", help="send day D's ad requests from the landing logs through a running `genrank serve` "
                                      "over HTTP (exit 1 on a 5xx or an unanswered request)")
    p.add_argument("--day", required=True, help="the landing day (YYYY-MM-DD)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the service (default http://127.0.0.1:8000)")
    p.add_argument("--home", default=home, help="data root holding landing/ (default GENRANK_HOME)")
    p.add_argument("--max-requests", type=int, default=100_000, help="send at most this many (default 100000)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="stop sending after this long (default 600)")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight (default 2)")
    p.add_argument("--allow-remote", action="store_true", help="allow a URL that is not a loopback address")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("ui", help="the Dagster UI and daemon (dagster dev) on the instance genrank run records into")
    p.add_argument("--home", default=home)
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(func=_cmd_ui)

    p = sub.add_parser("status", help="landed / processed / blocked days, the registry's aliases and the online store's "
                                      "day (exit 1 if a landed day is blocked, 2 without a landing zone)")
    p.add_argument("--home", default=home)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("rollback", help="move the genrank-ctr champion alias back to the previous version")
    p.add_argument("--home", default=home)
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser("stack", help="the production rehearsal on this machine: PostgreSQL, dagster-webserver and "
                                     "-daemon on a Postgres instance, an MLflow server, Spark standalone (deploy/stack.py)")
    p.add_argument("action", choices=["up", "down", "status", "env"],
                   help="up (idempotent), down (only what its PID files name), status (exit 1 unless all up), "
                        "env (the pipeline's variables as shell exports)")
    p.add_argument("--home", default=home)
    p.set_defaults(func=_cmd_stack)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # every input error of the project is a ValueError with a clear message
        print(f"genrank {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
