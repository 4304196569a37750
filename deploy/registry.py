"""The MLflow model registry as genrank uses it: versions, aliases, promotion and rollback.

Registered models: ``genrank-teacher`` (alias ``current``: the teacher whose logits are cached) and
``genrank-ctr`` (the served student; aliases ``champion`` = serving, ``challenger`` = waiting for
tomorrow's out-of-time evaluation, ``previous`` = what ``genrank rollback`` restores). Every version
is a pyfunc model logged as code (``deploy/pyfunc_model.py``, MLflow's models-from-code: nothing is
pickled) over the safetensors checkpoint, with an input example and a signature; its tags carry the
data window, teacher version, code version, metrics, the gate decision and the sha256 of the ONNX
graph that serves (checked by the service before it swaps), and its description is a short model card.

**A registration is all or nothing.** Registering takes several requests (the run's model and artifacts,
the version, waiting for it to be READY), and a tracking server can go away between any two of them; its
client also repeats a request whose answer it lost, which can create a version twice. So a version is
created with ``registration=in_progress`` among its tags (one request: the tags and the version are one
row) and marked ``complete`` as the last write of :meth:`Registry.log_version`. :meth:`Registry.find`
never returns an unfinished version, so no step reuses, evaluates or promotes one, and no alias is moved
before log_version returns; the next registration with the same identity (partition, data fingerprint,
code version) deletes those an earlier, failed attempt left. Versions registered before this tag existed
count as complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from contracts import settings
from deploy.onnx_export import ONNX_FILE, ONNX_SHA256_TAG

TEACHER = "genrank-teacher"
CTR = "genrank-ctr"
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
PYFUNC_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
CHECKPOINT_GLOB = "*.safetensors"
REGISTRATION_TAG, IN_PROGRESS, COMPLETE = "registration", "in_progress", "complete"
# What makes two registrations the same model: an unfinished version with these tags equal is an earlier attempt.
IDENTITY_TAGS = ("partition", "data_fingerprint", "code_version")


def code_version() -> str:
    """A content hash of models/ (what decides a trained model's behaviour), stable across clones."""
    h = hashlib.sha256()
    for p in sorted(MODELS_DIR.rglob("*.py")):
        h.update(p.relative_to(MODELS_DIR).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def data_fingerprint(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for folder in sorted(paths):
        for f in sorted(Path(folder).glob("*.parquet")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _first_user_day(samples: Path, scored: bool) -> pd.DataFrame:
    """The rows of a training_samples partition's first user-day (with a target to score, if ``scored``), read a
    row group at a time: the export keeps each user's rows together (transforms/sequences.py), so the rows end
    where another user's begin. Reading the whole partition instead took 1.2 GB on a `large` day."""
    import pyarrow.parquet as pq

    def row_groups():
        for f in sorted(Path(samples).glob("*.parquet")) if Path(samples).is_dir() else [Path(samples)]:
            pf = pq.ParquetFile(f)
            yield from (pf.read_row_group(i).to_pandas() for i in range(pf.num_row_groups))

    user, rows = None, None   # rows: those read that are, or may yet be, the user-day's
    for df in row_groups():
        if df.empty:
            continue
        rows = df if rows is None else pd.concat([rows, df], ignore_index=True)
        if user is None:
            candidates = rows.loc[rows["is_target"].fillna(False).astype(bool), "user_id"] if scored else rows["user_id"]
            if candidates.empty:   # the last user's rows so far may begin the user-day sought
                rows = rows[rows["user_id"] == rows["user_id"].iloc[-1]]
                continue
            user = candidates.iloc[0]
        mine = rows["user_id"] == user
        rows = rows[mine]
        if not mine.iloc[-1]:
            break
    if user is None:
        raise ValueError(f"{samples}: no {'target impression' if scored else 'row'} to take a user-day from")
    return rows.reset_index(drop=True)


def input_example(samples: Path) -> pd.DataFrame:
    """The first user-day of a training_samples partition (at most 64 events): a registered version's example."""
    return _first_user_day(samples, scored=False).head(64)


def scored_user_day(samples: Path) -> pd.DataFrame:
    """The first user-day of a training_samples partition that has a target to score, whole."""
    return _first_user_day(samples, scored=True)


@dataclass
class Registry:
    tracking_uri: str
    artifact_root: Path

    def __post_init__(self) -> None:
        import mlflow
        from mlflow import MlflowClient

        os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
        # mlflow.set_tracking_uri also writes MLFLOW_TRACKING_URI into the environment, which would make
        # every later default_registry() of this process open *this* store: keep the user's setting.
        user_setting = settings.env("MLFLOW_TRACKING_URI", "")
        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        if not user_setting:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = user_setting
        self.client = MlflowClient(self.tracking_uri, self.tracking_uri)

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        if self.tracking_uri.startswith(("http://", "https://")):
            return self.client.create_experiment(name)   # the server's artifact root: its mlflow-artifacts: proxy
        Path(self.artifact_root).mkdir(parents=True, exist_ok=True)
        return self.client.create_experiment(name, artifact_location=(Path(self.artifact_root) / name).resolve().as_uri())

    def log_version(self, name: str, run_id: str, checkpoint: Path, input_example: pd.DataFrame,
                    output_example: pd.DataFrame, tags: dict[str, str], description: str,
                    extra_artifacts: dict[str, Path] | None = None) -> str:
        """Log the checkpoint (and ``extra_artifacts``, e.g. the ONNX graph that serves, whose sha256
        becomes the version's ``onnx_sha256`` tag) as a pyfunc model under ``run_id`` and register it;
        returns the version, complete (module docstring), after deleting what failed attempts left."""
        import mlflow
        from mlflow.models import infer_signature

        extra = {k: Path(v) for k, v in (extra_artifacts or {}).items()}
        graphs = sorted(f for p in extra.values() for f in ([p] if p.is_file() else p.rglob(ONNX_FILE))
                        if f.name == ONNX_FILE)
        if graphs:
            tags = {**tags, ONNX_SHA256_TAG: hashlib.sha256(graphs[0].read_bytes()).hexdigest()}
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(PYFUNC_CODE),  # models-from-code: loading runs our file, unpickles nothing
                artifacts={"checkpoint": str(checkpoint), **{k: str(v) for k, v in extra.items()}},
                input_example=input_example,
                signature=infer_signature(input_example, output_example),
                pip_requirements=["genrank"],  # the project itself: avoids slow requirement inference
            )
        # model_id: a tracking server refuses a models:/ source without the logged model it names
        mv = self.client.create_model_version(name, info.model_uri, run_id=run_id, description=description,
                                              tags={**tags, REGISTRATION_TAG: IN_PROGRESS}, model_id=info.model_id)
        self._wait_ready(name, mv.version)
        self.client.set_model_version_tag(name, mv.version, REGISTRATION_TAG, COMPLETE)
        identity = {k: tags[k] for k in IDENTITY_TAGS if k in tags}
        for leftover in self.client.search_model_versions(f"name = '{name}'"):
            if leftover.tags.get(REGISTRATION_TAG) == IN_PROGRESS and all(leftover.tags.get(k) == v for k, v in identity.items()):
                self.client.delete_model_version(name, leftover.version)
        return mv.version

    def register_trained(self, name: str, model, history: list[dict], samples: Path, run_name: str,
                         run_tags: dict[str, str], checkpoint_metadata: dict, tags: dict[str, str], description: str,
                         extra_artifacts: dict[str, Path] | None = None) -> str:
        """Record a freshly trained ``model`` as one MLflow run of the experiment ``name`` (its config as
        parameters, ``train_loss`` per step of ``history``) and register it as a new version of ``name``
        (log_version), with ``samples``' first user-day as the input example; returns the version."""
        from mlflow.entities import Metric

        from models import predict, save_model

        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = Path(save_model(model, str(Path(tmp) / f"{model.kind}.safetensors"), metadata=checkpoint_metadata))
            run_id = self.client.create_run(self.experiment_id(name), run_name=run_name, tags=run_tags).info.run_id
            for k, v in dataclasses.asdict(model.cfg).items():
                self.client.log_param(run_id, k, str(v)[:500])
            # one call per 1,000 steps, not one per step (a SQLite commit each: seconds for a teacher)
            now = int(time.time() * 1000)
            losses = [Metric("train_loss", float(h["loss"]), now, i) for i, h in enumerate(history) if "loss" in h]
            for first in range(0, len(losses), 1000):
                self.client.log_batch(run_id, metrics=losses[first:first + 1000])
            # the output example (its schema is the signature's) is one user-day's scores: scoring the whole day for
            # it cost a teacher ten seconds
            example = input_example(samples)
            with tempfile.TemporaryDirectory() as scratch:
                scored_user_day(samples).to_parquet(Path(scratch) / "user_day.parquet", index=False)
                output = predict(model, scratch).drop(columns=["user_id"]).head(len(example))
            version = self.log_version(name, run_id, checkpoint, example, output, tags=tags, description=description,
                                       extra_artifacts=extra_artifacts)
            self.client.set_terminated(run_id)
        return version

    def ensure_registered(self, name: str, description: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description=description)

    def _wait_ready(self, name: str, version: str, timeout_s: float = 60) -> None:
        deadline = time.time() + timeout_s
        while self.client.get_model_version(name, version).status != "READY":
            if time.time() > deadline:
                raise RuntimeError(f"{name} v{version} did not become READY in {timeout_s} s")
            time.sleep(0.2)

    def by_alias(self, name: str, alias: str):
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None

    def complete_versions(self, name: str) -> list:
        """Every version of ``name`` whose registration finished ([] when the model is not registered yet):
        what anything may reuse, evaluate, warm-start from or promote."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name = '{name}'")
        except MlflowException:
            return []
        return [v for v in versions if v.tags.get(REGISTRATION_TAG) != IN_PROGRESS]

    def find(self, name: str, **tags: str):
        """The newest complete version of ``name`` whose tags match all of ``tags`` (None if none)."""
        hits = [v for v in self.complete_versions(name) if all(v.tags.get(k) == str(t) for k, t in tags.items())]
        return max(hits, key=lambda v: int(v.version)) if hits else None

    def artifact(self, name: str, version: str, dst: Path, pattern: str) -> Path:
        """Download a version's model files into ``dst``; returns the one file matching ``pattern``."""
        import mlflow.artifacts

        mv = self.client.get_model_version(name, version)
        local = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst))
        files = sorted(Path(local).rglob(pattern))
        if not files:
            raise FileNotFoundError(f"{name} v{version}: no {pattern} under {local}")
        return files[0]

    def checkpoint(self, name: str, version: str, dst: Path) -> Path:
        """Download a version's safetensors checkpoint; returns its local path."""
        return self.artifact(name, version, dst, CHECKPOINT_GLOB)

    def tag(self, name: str, version: str, tags: dict[str, object]) -> None:
        for k, v in tags.items():
            self.client.set_model_version_tag(name, version, k, v if isinstance(v, str) else json.dumps(v))

    def promote(self, name: str, version: str, reason: str) -> str | None:
        """champion := version; the old champion becomes previous. Returns the old champion's version."""
        old = self.by_alias(name, "champion")
        if old is not None and old.version == str(version):
            return None
        if old is not None:
            self.client.set_registered_model_alias(name, "previous", old.version)
        self.client.set_registered_model_alias(name, "champion", str(version))
        self.tag(name, str(version), {"promoted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      "promotion_reason": reason})
        return old.version if old is not None else None

    def rollback(self, name: str = CTR) -> tuple[str, str]:
        """champion := previous; returns (demoted version, restored version)."""
        champion, previous = self.by_alias(name, "champion"), self.by_alias(name, "previous")
        if previous is None or champion is None:
            raise ValueError(f"{name}: nothing to roll back to (champion={getattr(champion, 'version', None)}, "
                             f"previous={getattr(previous, 'version', None)})")
        self.client.set_registered_model_alias(name, "champion", previous.version)
        self.client.delete_registered_model_alias(name, "previous")
        self.tag(name, champion.version, {"rolled_back_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return champion.version, previous.version


def default_registry(home: Path, tracking_uri: str | None = None) -> Registry:
    return Registry(tracking_uri or settings.tracking_uri(home),
                    Path(home) / "mlartifacts")
