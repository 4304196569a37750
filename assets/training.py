"""Teacher, cached teacher logits, the daily student candidate, its out-of-time gates and promotion.

Flow of a daily run for day D (after events and sequences of D):
  teacher_logits(D)        the current teacher's probabilities for D's target impressions (cached)
  student_candidate(D)     warm-started from the newest candidate, trained on D (labels + KD);
                           registered as a new genrank-ctr version with alias ``challenger``
  challenger_evaluation(D) the candidate of D-1 and the champion scored on D (out of time, serving
                           conditions); the gates are its checks, WARN when they refuse
  promotion(D)             moves ``champion`` (old one -> ``previous``) when every gate passed (or the
                           evaluation was forced); a refused challenger leaves the champion and the run as
                           they are and the refusal in its metadata: a decision, nobody needs paging
  onnx_model(D)            the champion's ONNX serving bundle in GENRANK_HOME/serving/champion/
Every candidate is registered with its ONNX graph (deploy/onnx_export.py); the graph, not the torch
checkpoint, is what the parity and latency gates measure and what `genrank serve` runs.
``teacher_model`` is not daily: the weekly schedule (or an on-demand run) retrains it over a
trailing window of training samples.
"""

import dataclasses
import datetime as dt
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
from pydantic import Field

from deploy import evaluation
from deploy import registry as reg
from deploy.gates import SHADOW_GATES, GateConfig, GateResult, teacher_gate
from deploy.model_card import teacher_card
from deploy.onnx_export import OnnxScorer, find_bundle, parity, write_bundle
from models.config import DEMO_SIZES, DEMO_STUDENT_SIZES, DEMO_TEACHER_SIZES, ModelSizes
from contracts import settings
from assets.partitions import daily_partitions, run_partition_days
from assets.resources import GenrankPaths, MlflowResource
from transforms import sequences
from transforms.atomic import staged_dir

GROUP = "models"
GATES = ("auc", "logloss", "calibration", "onnx_parity", "latency", *SHADOW_GATES)


class ModelSizeConfig(dg.Config):
    """models.config.ModelSizes as run configuration; its defaults are DEMO_SIZES (what preset("demo") builds)."""

    d_model: int = DEMO_SIZES.d_model
    teacher_layers: int = DEMO_SIZES.teacher_layers
    student_layers: int = DEMO_SIZES.student_layers
    n_heads: int = DEMO_SIZES.n_heads
    student_events: int = DEMO_SIZES.student_events
    counter_events: int = DEMO_SIZES.counter_events
    item_buckets: int = DEMO_SIZES.item_buckets
    epochs: int = DEMO_SIZES.epochs
    patience: int = DEMO_SIZES.patience
    holdout: float = DEMO_SIZES.holdout
    max_steps: int = DEMO_SIZES.max_steps
    token_budget: int = DEMO_SIZES.token_budget
    lr: float = DEMO_SIZES.lr
    id_dropout: float = DEMO_SIZES.id_dropout
    seed: int = DEMO_SIZES.seed
    ckpt_every: int = DEMO_SIZES.ckpt_every
    torch_threads: int | None = None   # None: GENRANK_TORCH_THREADS, read when the run starts

    def sizes(self) -> ModelSizes:
        return ModelSizes(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelSizes)})

    def train_config(self):
        """The TrainConfig of these sizes, with torch's intra-op threads set for the run (GENRANK_TORCH_THREADS)."""
        import torch

        from models.config import train_config

        torch.set_num_threads(self.torch_threads if self.torch_threads is not None else settings.torch_threads())
        return train_config(self.sizes())

    def recipe(self):
        """(the model's configuration, its TrainConfig): what this run configuration trains. The defaults are what
        `genrank run` trains and serves; benchmarks/quality_suite trains exactly this too (tests/test_recipe.py)."""
        return self.architecture(), self.train_config()


def _samples(paths: GenrankPaths, day: str) -> Path:
    path = paths.lake_partition("training_samples", day)
    if not path.is_dir():
        raise ValueError(f"training_samples partition {day} is missing ({path}): materialise the sequence models first")
    return path


def _has_targets(paths: GenrankPaths, day: str) -> bool:
    """Whether D's samples hold an impression to learn from or judge on. A day the source declared empty
    (a recorded empty partition) holds none: the model stages skip it, and it is no day of a teacher's window."""
    return bool(pd.read_parquet(_samples(paths, day), columns=["is_target"])["is_target"].fillna(False).any())


def _registry(paths: GenrankPaths, mlflow: MlflowResource) -> reg.Registry:
    return reg.Registry(mlflow.tracking_uri, paths.root / "mlartifacts")


def _model_card(kind: str, window: str, metrics: dict, extra: str = "") -> str:
    shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("auc", "gauc", "logloss") if k in metrics)
    return f"genrank {kind}. Trained on training_samples {window}. {shown}. {extra}".strip()


# ----------------------------------------------------------------------------------------- teacher

class TeacherTrainingConfig(ModelSizeConfig):
    window_days: int = Field(default=7, ge=1)   # trailing days of training samples (see teacher_model)
    token_budget: int = DEMO_TEACHER_SIZES.token_budget
    force: bool = False    # retrain even if a teacher exists for the same data and code
    # Inside the daily run of day D: the first teacher once min_days days of samples precede D (one to
    # train on, one whose history it sees), then a retrain every every_days days (weekly, as production
    # teachers are refreshed; `genrank demo` uses 3 to show a retrain within its 8 days).
    every_days: int = 7
    min_days: int = 2

    def architecture(self):
        """The teacher these sizes describe (models.config.teacher_config)."""
        from models.config import teacher_config

        return teacher_config(self.sizes())


def teacher_due(day: str, sample_days_before: list[str], current_window: str | None, every_days: int,
                min_days: int) -> tuple[bool, str]:
    """Whether the daily run of ``day`` retrains the teacher before caching its logits, and why.

    ``current_window`` is the current teacher's ``first..last`` training window: it was trained for the
    day after ``last``, so it is due again ``every_days`` after that day."""
    if len(sample_days_before) < min_days:
        return False, f"{len(sample_days_before)} day(s) of samples before {day}; the first teacher needs {min_days}"
    if current_window is None:
        return True, "no teacher yet"
    first_use = dt.date.fromisoformat(current_window.split("..")[-1]) + dt.timedelta(days=1)
    due_on = first_use + dt.timedelta(days=every_days)
    if dt.date.fromisoformat(day) >= due_on:
        return True, f"the teacher trained through {current_window.split('..')[-1]} was due on {due_on}"
    return False, f"the teacher trained through {current_window.split('..')[-1]} serves until {due_on}"


@dg.asset(group_name=GROUP, deps=["training_samples"], pool="training",
          description="The full-token CADET-style teacher over a trailing window, registered as genrank-teacher "
                      "with alias 'current'. In a daily run it retrains when due (teacher_due) and otherwise "
                      "records the version that serves the day; teacher_job retrains it on demand.")
def teacher_model(context: dg.AssetExecutionContext, config: TeacherTrainingConfig, paths: GenrankPaths,
                  mlflow: MlflowResource) -> dg.MaterializeResult:
    from models import train_teacher

    r = _registry(paths, mlflow)
    day = context.run.tags.get("dagster/partition")   # None when teacher_job runs it on demand
    days = [d for d in paths.lake_days("training_samples") if (day is None or d < day) and _has_targets(paths, d)]
    why = "on demand (teacher_job)" if day is None else "forced"
    if day is not None and not config.force:
        current = r.by_alias(reg.TEACHER, "current")
        due, why = teacher_due(day, days, current.tags.get("window") if current else None,
                               config.every_days, config.min_days)
        if not due:
            return dg.MaterializeResult(metadata={
                "version": current.version if current else "none", "retrained": False, "reason": why})
    days = days[-config.window_days:]
    if not days:
        raise ValueError(f"no training_samples partition under {paths.lake / 'training_samples'}: nothing to train a teacher on")
    folders = [_samples(paths, d) for d in days]
    fingerprint, code = reg.data_fingerprint(folders), reg.code_version()
    existing = r.find(reg.TEACHER, data_fingerprint=fingerprint, code_version=code)
    if existing is not None and not config.force:
        r.client.set_registered_model_alias(reg.TEACHER, "current", existing.version)
        return dg.MaterializeResult(metadata={"version": existing.version, "retrained": False, "reused": True,
                                              "window": f"{days[0]}..{days[-1]}", "reason": f"{why}; same data and code"})
    started = time.perf_counter()
    # A killed run resumes from its checkpoint; the checkpoint goes once the version is registered.
    ckpt_dir = paths.root / "checkpoints" / f"teacher-{fingerprint}-{code}"
    # Every day of the window trains but the newest day's latest impressions (train_config's holdout), which
    # pick the pass and calibrate. Its out-of-time AUC is recorded per day by teacher_logits.
    result = train_teacher([str(_samples(paths, d)) for d in days], *config.recipe(), ckpt_dir=str(ckpt_dir),
                           resume=True)
    seconds = time.perf_counter() - started
    r.ensure_registered(reg.TEACHER, "Full-token CADET-style teacher; its cached logits distil the student.")
    window = f"{days[0]}..{days[-1]}"
    version = r.register_trained(
        reg.TEACHER, result.model, result.history, folders[-1], run_name=f"teacher-{days[-1]}",
        run_tags={"window": window}, checkpoint_metadata={"window": days},
        tags={"window": window, "data_fingerprint": fingerprint, "code_version": code,
              "final_train_loss": f"{result.history[-1]['loss']:.6f}" if result.history else "nan"},
        description=_model_card("teacher", window, {}, "Out-of-time AUC per day: metrics auc_YYYY_MM_DD on its run."))
    r.client.set_registered_model_alias(reg.TEACHER, "current", version)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return dg.MaterializeResult(metadata={
        "version": version, "retrained": True, "reason": why, "window": f"{days[0]}..{days[-1]}", "train_seconds": seconds,
        "steps": result.step, "best_pass": result.best_epoch,
        "held_out_auc_by_pass": dg.MetadataValue.json(result.val_curve),
        "tokens_per_s": float(result.throughput.get("tokens_per_s", float("nan"))),
    })


# ----------------------------------------------------------------------------------- teacher logits

# The reproduction check re-scores this many users (the first by id) with the registered teacher; the
# tolerance absorbs the float summation order of another batch composition.
TEACHER_LOGITS_REPRODUCED_USERS = 25
TEACHER_LOGITS_TOLERANCE = 1e-5


def _logits_path(paths: GenrankPaths, day: str) -> Path:
    return paths.lake_partition("teacher_logits", day) / "part-0.parquet"


def _kd_gate_path(paths: GenrankPaths, day: str) -> Path:
    # "_" first: Parquet readers skip it, so the partition folder stays a dataset whoever reads it whole
    return paths.lake_partition("teacher_logits", day) / "_kd_gate.json"


def _champion_serving(r: reg.Registry, day: str):
    """The genrank-ctr champion that served day D: the champion alias, unless it was promoted on D itself (its
    challenger judged on D, in this run or a rerun), then the version it replaced. None before the first."""
    for alias in ("champion", "previous"):
        version = r.by_alias(reg.CTR, alias)
        if version is None or version.tags.get("evaluated_on", "") < day:
            return version
    return None


def kd_gate(r: reg.Registry, paths: GenrankPaths, day: str, teacher, teacher_pred: pd.DataFrame,
            holdout: float) -> GateResult:
    """The teacher gate of day D: the teacher against what served D (deploy.gates.teacher_gate) on D's held-out
    slice, the latest ``holdout`` share of D's impressions, which the student picks its pass on and never trains
    on; both models were trained before D. The teacher's side is ``teacher_pred``, its cached probabilities of D
    (with labels) on the slice's impressions: the gate judges the very logits the student would distil, and the
    teacher is not run twice (re-scored as the slice's own sample it differs by a mean 3e-4; it was a third of
    teacher_logits' time in `make demo`)."""
    from models import load_model, predict
    from models.data import time_holdout
    from models.metrics import auc

    with tempfile.TemporaryDirectory() as tmp:
        _, [held_out] = time_holdout([str(_samples(paths, day))], holdout, str(Path(tmp) / "slice"))
        slice_ids = pd.read_parquet(held_out, columns=["impression_id", "is_target"]).query("is_target")["impression_id"]
        teacher_pred = teacher_pred[teacher_pred["impression_id"].isin(slice_ids)]
        champion = _champion_serving(r, day)
        if champion is not None:
            reference = predict(load_model(str(r.checkpoint(reg.CTR, champion.version, Path(tmp) / "c"))), held_out,
                                with_labels=True)
            name = f"champion v{champion.version}"
        else:
            try:
                baseline = sequences.bucket_ctr_baseline(paths.root, day)
                name = "baseline"
            except ValueError:   # no position CTR before D (its first day, rerun): nothing shows the teacher better
                baseline = pd.DataFrame({"impression_id": [], "p": [], "label": []})
                name = f"baseline (no position CTR before {day})"
            reference = baseline[baseline["impression_id"].isin(teacher_pred["impression_id"])]

    def slice_auc(pred: pd.DataFrame) -> float:
        return float(auc(pred["label"].to_numpy(), pred["p"].to_numpy())) if pred["label"].nunique() == 2 else float("nan")

    return teacher_gate(slice_auc(teacher_pred), slice_auc(reference), f"teacher v{teacher.version}", name)


def read_kd_gate(paths: GenrankPaths, day: str) -> GateResult:
    """The teacher gate teacher_logits recorded for D (written with the logits, in the same partition)."""
    return GateResult(**json.loads(_kd_gate_path(paths, day).read_text()))


class TeacherLogitsConfig(dg.Config):
    holdout: float = DEMO_SIZES.holdout   # the held-out share of D the teacher gate judges on (the student's)


@dg.asset(
    group_name=GROUP, partitions_def=daily_partitions(), deps=["training_samples", teacher_model], pool="training",
    output_required=False,
    description="The current teacher's probabilities for every target impression of day D, keyed by "
                "impression_id and tagged with the teacher version, and the teacher gate: they are the student's "
                "KD targets only if the teacher beats what served D on D's held-out slice. Skipped while no "
                "teacher exists.",
)
def teacher_logits(context: dg.AssetExecutionContext, config: TeacherLogitsConfig, paths: GenrankPaths,
                   mlflow: MlflowResource):
    from models import load_model, predict
    from models.metrics import auc

    day = context.partition_key
    samples = _samples(paths, day)
    r = _registry(paths, mlflow)
    if not _has_targets(paths, day):
        context.log.info(f"{day} has no target impressions (a declared-empty day): no cached logits, no candidate")
        return
    teacher = r.by_alias(reg.TEACHER, "current")
    if teacher is None:
        context.log.warning(f"no genrank-teacher version yet: {day} gets no cached logits (materialise teacher_model)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(str(r.checkpoint(reg.TEACHER, teacher.version, Path(tmp))))
    pred = predict(model, str(samples), with_labels=True)
    # As a string: a tracking server answers versions as strings, the SQLite store as ints, and the bytes of
    # this partition are part of the student's data_fingerprint (the same day must hash the same on both).
    pred["teacher_version"] = str(teacher.version)
    day_auc = float(auc(pred["label"].to_numpy(), pred["p"].to_numpy()))
    r.client.log_metric(teacher.run_id, f"auc_{day.replace('-', '_')}", day_auc)
    logged = r.client.get_run(teacher.run_id)
    aucs = {k.removeprefix("auc_").replace("_", "-"): v for k, v in logged.data.metrics.items() if k.startswith("auc_")}
    r.client.update_model_version(reg.TEACHER, teacher.version, description=teacher_card(
        teacher.version, teacher.tags.get("window", "?"), teacher.tags.get("code_version", "?"), aucs,
        f"#/experiments/{logged.info.experiment_id}/runs/{teacher.run_id}"))
    gate = kd_gate(r, paths, day, teacher, pred, config.holdout)
    out = _logits_path(paths, day)
    with staged_dir(out.parent) as staging:   # the logits and the gate that admits them land together
        pred[["impression_id", "user_id", "position_bucket", "p", "logit", "label", "teacher_version"]].to_parquet(
            staging / out.name, index=False)
        (staging / _kd_gate_path(paths, day).name).write_text(json.dumps(dataclasses.asdict(gate), indent=1))
    yield dg.Output(None, metadata={"rows": len(pred), "teacher_version": str(teacher.version), "auc": day_auc,
                                    "kd_admitted": gate.passed, "kd_gate": gate.reason,
                                    "path": dg.MetadataValue.path(str(out))})


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(n, asset="teacher_logits", blocking=True) for n in
           ("coverage", "finite", "one_teacher_version", "reproduced_by_teacher", "kd_gate")],
    can_subset=False,
)
def teacher_logits_checks(context: dg.AssetCheckExecutionContext, paths: GenrankPaths, mlflow: MlflowResource):
    """Each check reads what it guards from its own source: D's targets from training_samples (coverage),
    the registry's current teacher (the partition holds its version and only it), and the registered
    teacher itself, re-scoring a sample of D's users (the cached probabilities are what it computes)."""
    from models import load_model, predict

    [day] = run_partition_days(context.run.tags)
    yield _kd_gate_check(paths, day)
    cached = pd.read_parquet(_logits_path(paths, day))
    # three columns of the day, and below only the reproduced users' rows: the whole partition as a DataFrame
    # was 1.2 GB on a `large` day
    samples = pd.read_parquet(_samples(paths, day), columns=["user_id", "is_target", "impression_id"])
    expected = set(samples.loc[samples["is_target"], "impression_id"])
    missing = expected - set(cached["impression_id"])
    yield dg.AssetCheckResult(check_name="coverage", asset_key="teacher_logits", passed=not missing,
                              metadata={"targets": len(expected), "cached": len(cached), "missing": len(missing),
                                        "sample_missing": dg.MetadataValue.json(sorted(missing)[:5])})
    finite = np.isfinite(cached["logit"].to_numpy()).all() and np.isfinite(cached["p"].to_numpy()).all()
    yield dg.AssetCheckResult(check_name="finite", asset_key="teacher_logits", passed=bool(finite))
    r = _registry(paths, mlflow)
    current = r.by_alias(reg.TEACHER, "current")
    versions = sorted(cached["teacher_version"].astype(str).unique())
    yield dg.AssetCheckResult(
        check_name="one_teacher_version", asset_key="teacher_logits",
        passed=current is not None and versions == [str(current.version)],
        metadata={"versions_in_partition": dg.MetadataValue.json(versions),
                  "registry_current": str(current.version) if current else "none"})
    if current is None:
        yield dg.AssetCheckResult(check_name="reproduced_by_teacher", asset_key="teacher_logits", passed=False,
                                  description="no genrank-teacher@current to reproduce the cache with")
        return
    users = sorted(samples["user_id"].unique())[:TEACHER_LOGITS_REPRODUCED_USERS]
    with tempfile.TemporaryDirectory() as tmp:
        subset = Path(tmp) / "samples"
        subset.mkdir()
        pd.read_parquet(_samples(paths, day), filters=[("user_id", "in", users)]).to_parquet(
            subset / "part-0.parquet", index=False)
        model = load_model(str(r.checkpoint(reg.TEACHER, current.version, Path(tmp) / "teacher")))
        fresh = predict(model, str(subset))
    both = fresh[["impression_id", "p"]].merge(cached[["impression_id", "p"]], on="impression_id", suffixes=("", "_cached"))
    worst = float(np.abs(both["p"] - both["p_cached"]).max()) if len(both) else float("nan")
    yield dg.AssetCheckResult(
        check_name="reproduced_by_teacher", asset_key="teacher_logits",
        passed=bool(len(both) == len(fresh) > 0 and worst <= TEACHER_LOGITS_TOLERANCE),
        description=f"genrank-teacher v{current.version} re-scored {len(both)} targets of {len(users)} users: "
                    f"max |p - cached p| = {worst:.2e}",
        metadata={"rescored_targets": len(both), "max_abs_diff": worst})


def _kd_gate_check(paths: GenrankPaths, day: str) -> dg.AssetCheckResult:
    """A refused teacher is a decision (WARN: the student trains on labels alone, and says so); a partition
    without a readable gate is an ERROR, which blocks the student."""
    try:
        gate = read_kd_gate(paths, day)
    except (OSError, ValueError, TypeError) as exc:
        return dg.AssetCheckResult(check_name="kd_gate", asset_key="teacher_logits", passed=False,
                                   severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"no readable teacher gate for {day}: {type(exc).__name__}: {exc}")
    return dg.AssetCheckResult(
        check_name="kd_gate", asset_key="teacher_logits", passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR if gate.passed else dg.AssetCheckSeverity.WARN,
        description=gate.reason + ("" if gate.passed else ": the student of the day trains on labels alone"),
        metadata={"teacher_auc": float(gate.observed), "reference_auc": float(gate.threshold), "reason": gate.reason})


# -------------------------------------------------------------------------------- student candidate

class StudentTrainingConfig(ModelSizeConfig):
    # a warm-started candidate passes at most this often over its new day (daily incremental training); the
    # day's latest impressions choose how often, as for a cold start (at most `epochs`)
    warm_epochs: int = 4
    # The served head's per-bucket calibration is fitted on the held-out slices (the latest `holdout` share) of
    # the newest `calibration_days` days up to D: the daily student trains on D only, so none of them is in its
    # training data. One day's slice (60-110 clicks on the demo world) gave next-day pred/obs with an RMS log
    # error of 0.107 over the daily students of two simulated worlds, three days' 0.086 (demo 0.088 -> 0.096,
    # a 12-day seed-3 world 0.115 -> 0.080; two 0.095, four 0.099): benchmarks/RESULTS.md, "Calibration on the
    # next day".
    calibration_days: int = Field(default=3, ge=1)
    lr: float = DEMO_STUDENT_SIZES.lr
    force: bool = False          # register a new version even if one exists for this day, data and code

    def architecture(self):
        """The served student these sizes describe (models.config.student_config)."""
        from models.config import student_config

        return student_config(self.sizes())


# The candidate of D warm-starts from the candidate of D-1: declared, so that a backfill launched from the
# UI (one run per day) materialises the days in order instead of warm-starting from whatever exists.
PREVIOUS_DAY = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


@dg.asset(group_name=GROUP, partitions_def=daily_partitions(), pool="training",
          deps=[teacher_logits, dg.AssetDep("student_candidate", partition_mapping=PREVIOUS_DAY)],
          description="The student warm-started from the newest candidate and trained on day D with labels "
                      "and the cached teacher probabilities; registered as genrank-ctr with alias 'challenger'.")
def student_candidate(context: dg.AssetExecutionContext, config: StudentTrainingConfig, paths: GenrankPaths,
                      mlflow: MlflowResource) -> dg.MaterializeResult:
    from models import calibrate_on_days, load_model
    from models.distributed import train_student_procs

    day = context.partition_key
    samples = _samples(paths, day)
    logits_path = _logits_path(paths, day)
    gate = read_kd_gate(paths, day)
    # a refused teacher's partition is never read: its probabilities are no targets
    teacher_probs = pd.read_parquet(logits_path, columns=["impression_id", "p", "teacher_version"]) if gate.passed else None
    kd = f"on: {gate.reason}" if gate.passed else f"off: {gate.reason}"
    teacher_version = str(teacher_probs["teacher_version"].iloc[0]) if gate.passed else "none"
    r = _registry(paths, mlflow)
    calibration_days = [d for d in paths.lake_days("training_samples") if d <= day and _has_targets(paths, d)]
    calibration_days = calibration_days[-config.calibration_days:]
    fingerprint = reg.data_fingerprint([samples, logits_path.parent, *(_samples(paths, d) for d in calibration_days)])
    code = reg.code_version()
    existing = r.find(reg.CTR, partition=day, data_fingerprint=fingerprint, code_version=code)
    if existing is not None and not config.force:
        return dg.MaterializeResult(metadata={"version": existing.version, "reused": True})
    previous = _newest_candidate_before(r, day)
    r.ensure_registered(reg.CTR, "The served CTR student (TM20K-style token merging, dual-head distillation).")
    student_cfg, recipe_train_cfg = config.recipe()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        init = load_model(str(r.checkpoint(reg.CTR, previous.version, tmp / "init"))) if previous is not None else None
        if init is not None and init.cfg != student_cfg:
            # A release that changes the student (its features, sizes, merges) cannot reuse older weights.
            context.log.warning(f"candidate v{previous.version} has another student config: {day} starts cold")
            init, previous = None, None
        started = time.perf_counter()
        ckpt_dir = paths.root / "checkpoints" / f"student-{day}-{fingerprint}-{code}"
        epochs = config.warm_epochs if init is not None else config.epochs
        train_cfg = dataclasses.replace(recipe_train_cfg, epochs=epochs)
        result = train_student_procs(settings.train_procs(), str(samples),
                                     teacher_probs[["impression_id", "p"]] if gate.passed else None,
                                     student_cfg, train_cfg, init_from=init, ckpt_dir=str(ckpt_dir))
        if train_cfg.holdout > 0:  # no held-out share: fit trains on everything, uncalibrated
            calibrate_on_days(result.model, [_samples(paths, d) for d in calibration_days], train_cfg.holdout,
                              str(tmp / "calibration"))
        seconds = time.perf_counter() - started
        bundle = write_bundle(result.model, tmp / "serving")  # its parity is a gate of the next day's run
        tags = {"partition": day, "data_window": f"{day}..{day}", "teacher_version": teacher_version, "kd": kd,
                "calibration_window": f"{calibration_days[0]}..{calibration_days[-1]}",
                "code_version": code, "data_fingerprint": fingerprint,
                "warm_start_from": previous.version if previous is not None else "none",
                "gate_decision": "pending"}
        version = r.register_trained(
            reg.CTR, result.model, result.history, samples, run_name=f"student-{day}", run_tags={"partition": day},
            checkpoint_metadata={"partition": day}, tags=tags,
            description=_model_card("student candidate", day, {},
                                    f"Distillation {kd}. Awaits the out-of-time gates on the next day."),
            extra_artifacts={"serving": bundle.onnx.parent})
    r.client.set_registered_model_alias(reg.CTR, "challenger", version)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return dg.MaterializeResult(metadata={
        "version": version, "teacher_version": teacher_version, "kd": kd, "train_seconds": seconds,
        "warm_start_from": tags["warm_start_from"], "best_pass": result.best_epoch,
        "held_out_auc_by_pass": dg.MetadataValue.json(result.val_curve),
        "calibration_window": tags["calibration_window"],
        "calibration_shift_by_bucket": dg.MetadataValue.json(
            [round(float(x), 4) for x in result.model.main_head.calibration]),
        "final_loss": float(result.history[-1]["loss"]) if result.history and "loss" in result.history[-1] else float("nan"),
        "tokens_per_s": float(result.throughput.get("tokens_per_s", float("nan"))),
    })


def _newest_candidate_before(r: reg.Registry, day: str):
    earlier = [v for v in r.complete_versions(reg.CTR) if v.tags.get("partition", "") < day]
    return max(earlier, key=lambda v: (v.tags["partition"], int(v.version))) if earlier else None


# -------------------------------------------------------------------------- evaluation and promotion

class EvaluationConfig(dg.Config):
    auc_tolerance: float = GateConfig.auc_tolerance
    logloss_tolerance: float = GateConfig.logloss_tolerance
    calibration_low: float = GateConfig.calibration_band[0]
    calibration_high: float = GateConfig.calibration_band[1]
    calibration_min_clicks: int = GateConfig.calibration_min_clicks
    latency_budget_ms: float | None = None  # None: GENRANK_LATENCY_BUDGET_MS, read when the run starts
    latency_requests: int = 30   # day D's first user-days, scored one request at a time on the ONNX graph
    parity_tolerance: float = GateConfig.parity_tolerance
    shadow_requests: int = 500   # the champion's logged requests of D the challenger shadow-scores (first in time)
    shadow_rank_floor: float = GateConfig.shadow_rank_floor
    shadow_shift_low: float = GateConfig.shadow_shift_band[0]
    shadow_shift_high: float = GateConfig.shadow_shift_band[1]
    force: bool = False  # promote even if gates fail; recorded on the version

    def gate_config(self) -> GateConfig:
        budget = self.latency_budget_ms if self.latency_budget_ms is not None else settings.latency_budget_ms()
        return GateConfig(self.auc_tolerance, self.logloss_tolerance, (self.calibration_low, self.calibration_high),
                          self.calibration_min_clicks, budget, self.parity_tolerance, self.shadow_rank_floor,
                          (self.shadow_shift_low, self.shadow_shift_high))


def _gates_path(paths: GenrankPaths, day: str) -> Path:
    return paths.lake_partition("evaluations", day) / "gates.json"


@dg.asset(
    group_name=GROUP, partitions_def=daily_partitions(), deps=["training_samples"], pool="training",
    output_required=False,
    description="Yesterday's candidate and the current champion (or, before the first promotion, the "
                "per-bucket historical-CTR baseline) scored on day D under serving conditions, and the candidate "
                "shadow-scored on the champion's logged requests of D (none logged: not shadow-scored); each gate "
                "is a check of this asset, WARN when it refuses (a refusal is a decision, not a failed run).",
)
def challenger_evaluation(context: dg.AssetExecutionContext, config: EvaluationConfig, paths: GenrankPaths,
                          mlflow: MlflowResource):
    day = context.partition_key
    yesterday = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
    samples = _samples(paths, day)
    r = _registry(paths, mlflow)
    challenger = r.find(reg.CTR, partition=yesterday)
    if challenger is None:
        context.log.info(f"no candidate was trained on {yesterday}: nothing to evaluate on {day}")
        return
    if not _has_targets(paths, day):
        # It stays the challenger; the next candidate warm-starts from it and is judged on the next day with data.
        context.log.info(f"{day} has no target impressions (a declared-empty day): genrank-ctr v{challenger.version} "
                         f"of {yesterday} is not evaluated")
        return
    champion = r.by_alias(reg.CTR, "champion")
    shadow = evaluation.shadow_score(paths.root, r, challenger.version, champion.version if champion else None,
                                     settings.serve_prediction_log(paths.root), day, config.shadow_requests)
    scored = evaluation.score(r, challenger, champion, samples, lambda: sequences.bucket_ctr_baseline(paths.root, day),
                              config.latency_requests, shadow)
    if scored.reference_kind == "itself":
        context.log.warning(f"genrank-ctr v{challenger.version} is already the champion (a rerun after its promotion): "
                            "the AUC and log-loss gates have nothing to compare")
    gates = evaluation.run_gates(scored, config.gate_config())
    decision, reasons = evaluation.decide(gates, config.force)
    evaluation.record(r, challenger, day, scored, gates, decision, reasons,
                      f"the challenger_evaluation config (force: true) of Dagster run {context.run_id}"
                      if decision == "forced" else None)
    gates_path = _gates_path(paths, day)
    evaluation.write_gates(gates_path, challenger.version, config.force, gates)
    yield dg.Output(None, metadata={
        "challenger_version": challenger.version, "compared_with": scored.reference_name,
        "reference_kind": scored.reference_kind, "decision": decision, "reasons": reasons,
        "challenger_auc": scored.challenger_metrics["auc"], "reference_auc": scored.reference_metrics["auc"],
        "challenger_gauc": scored.challenger_metrics["gauc"], "challenger_logloss": scored.challenger_metrics["logloss"],
        "reference_logloss": scored.reference_metrics["logloss"], "latency_p99_ms": scored.latency_p99_ms,
        "onnx_max_abs_diff": scored.onnx_max_abs_diff,
        "shadow_requests": shadow.requests, "shadow_rank_correlation": shadow.rank_correlation,
        "shadow_latency_p99_ms": shadow.latency_p99_ms, "gates": dg.MetadataValue.path(str(gates_path)),
    })


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(f"gate_{g}", asset="challenger_evaluation") for g in GATES],
    can_subset=False,
)
def promotion_gates(context: dg.AssetCheckExecutionContext, paths: GenrankPaths):
    """The gates of the day's evaluation, WARN when they refuse: a refused challenger is a decision the
    registry records (promotion leaves the champion), not a run an on-call engineer must look at."""
    [day] = run_partition_days(context.run.tags)
    challenger_version, forced, gates = evaluation.read_gates(_gates_path(paths, day))
    for g in gates:
        yield dg.AssetCheckResult(
            check_name=f"gate_{g.name}", asset_key="challenger_evaluation",
            passed=bool(g.passed or forced), severity=dg.AssetCheckSeverity.WARN, description=g.reason,
            metadata={"observed": float(g.observed), "threshold": float(g.threshold), "reason": g.reason,
                      "challenger_version": challenger_version, "forced": bool(forced and not g.passed)})


@dg.asset(group_name=GROUP, partitions_def=daily_partitions(), deps=[challenger_evaluation], pool="training",
          description="Moves 'champion' to the challenger that passed today's gates (or was forced through); the "
                      "old champion becomes 'previous' (what `genrank rollback` restores). A refused challenger "
                      "leaves the aliases as they are: materialised with decision 'refused' and the gates' reasons.")
def promotion(context: dg.AssetExecutionContext, paths: GenrankPaths, mlflow: MlflowResource) -> dg.MaterializeResult:
    day = context.partition_key
    yesterday = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
    r = _registry(paths, mlflow)
    challenger = r.find(reg.CTR, partition=yesterday)
    if challenger is None or challenger.tags.get("evaluated_on") != day:
        raise ValueError(f"no challenger evaluated on {day}: materialise challenger_evaluation for {day} first")
    decision, reasons = challenger.tags.get("gate_decision"), challenger.tags.get("gate_reasons", "")
    if decision == "refused":
        champion = r.by_alias(reg.CTR, "champion")
        context.log.warning(f"genrank-ctr v{challenger.version} was refused on {day}: {reasons}; the champion stays "
                            f"{f'v{champion.version}' if champion else 'none'}")
        return dg.MaterializeResult(metadata={
            "champion_version": champion.version if champion else "none", "previous_version": "unchanged",
            "promoted": False, "challenger_version": challenger.version, "decision": decision, "reasons": reasons})
    if decision not in ("approved", "forced"):
        raise ValueError(f"genrank-ctr v{challenger.version} has the gate decision {decision!r} on {day}, none of "
                         f"approved, forced or refused: {reasons}")
    demoted = r.promote(reg.CTR, challenger.version, f"{decision} on {day}: {reasons}")
    return dg.MaterializeResult(metadata={
        "champion_version": challenger.version, "previous_version": demoted or "unchanged", "promoted": True,
        "challenger_version": challenger.version, "decision": decision, "reasons": reasons,
    })


@dg.asset(group_name=GROUP, partitions_def=daily_partitions(), deps=[promotion], pool="training",
          output_required=False,
          description="The champion's ONNX graph and serving config after day D's promotion, in "
                      "GENRANK_HOME/serving/champion/ (the bundle a serving host deploys; `genrank serve` reads "
                      "the same files from the registry), smoke-scored with onnxruntime on D's requests. Nothing "
                      "when no challenger has been promoted yet (the first one was refused).")
def onnx_model(context: dg.AssetExecutionContext, paths: GenrankPaths, mlflow: MlflowResource):
    from models import load_model

    day = context.partition_key
    r = _registry(paths, mlflow)
    champion = r.by_alias(reg.CTR, "champion")
    if champion is None:
        context.log.info(f"no {reg.CTR} champion after {day}'s promotion (its challenger was refused): nothing to export")
        return
    final = paths.root / "serving" / "champion"
    with staged_dir(final) as staging:
        model = load_model(str(r.checkpoint(reg.CTR, champion.version, staging / "download")))
        bundle = find_bundle(staging / "download")
        shutil.copy2(bundle.onnx, staging / bundle.onnx.name)
        shutil.copy2(bundle.config, staging / bundle.config.name)
        shutil.rmtree(staging / "download")
        scorer = OnnxScorer(staging / bundle.onnx.name, threads=1)
        requests = evaluation.serving_requests(model, _samples(paths, day), 5)
        check = parity(model, scorer, requests)
        if not check.passed:
            raise ValueError(f"{reg.CTR} v{champion.version}: the exported graph differs from the checkpoint by "
                             f"{check.max_abs_diff:.2e} on {day}'s requests")
        digest = hashlib.sha256((staging / bundle.onnx.name).read_bytes()).hexdigest()
        (staging / "champion.json").write_text(json.dumps({
            "model": reg.CTR, "version": champion.version, "promoted_on": champion.tags.get("evaluated_on", day),
            "onnx_sha256": digest,
            "providers": scorer.providers}, indent=1))
    yield dg.MaterializeResult(metadata={
        "champion_version": champion.version, "path": dg.MetadataValue.path(str(final / bundle.onnx.name)),
        "onnx_sha256": digest, "size_bytes": (final / bundle.onnx.name).stat().st_size,
        "providers": ", ".join(scorer.providers), "parity_max_abs_diff": check.max_abs_diff,
        "parity_candidates": check.candidates,
    })
