"""The scoring service: FastAPI over onnxruntime, serving ``models:/genrank-ctr@champion``.

    POST /v1/score   one request: a user (history from the sequence store) or an inline history, and
                     up to max_candidates ads; returns P(click | position bucket k) per candidate and
                     the model version that scored it
    GET  /healthz    200 once a model is loaded, 503 before
    GET  /v1/model   the loaded version, its config, providers and the sequence store's day
    GET  /metrics    Prometheus metrics (deploy/service_metrics.py)

Every scored request is recorded in the prediction log (deploy/prediction_log.py) off the request path:
a full queue or a failed write drops records and counts them in the metrics, never delays a request.

Hot swap: a watcher thread polls the champion alias (and the online store) every ``poll_s``; a new
champion is downloaded, its ONNX file checked against the version's ``onnx_sha256`` tag, and its
onnxruntime session built beside the old one, then one reference is swapped. A request reads that
reference once, so requests in flight finish on the model they started with and none is dropped.

Scale: histories come from the online store (deploy/sequence_store.py), one user per request, never
from the lake; a request is prepared with numpy (deploy/event_codec.py) and JSON goes through orjson.
``genrank serve --workers N`` runs N processes, each with its own session, watcher and store handle.

Bad input is the client's problem and says so: malformed JSON, non-finite numbers, wrong types, unknown
fields, too many candidates or history events get a 422 that names the field; a body over the size
limit a 413 (counted while reading, however the body is framed); an unknown user without an inline
history a 404 (send ``history: []`` to score a new user cold); a store that is missing, half-written or
of another format a 503 that says which. Each refusal carries the reason the metrics count it under
(``Refused``). Unknown
ad, campaign or category ids are not errors: they are hashed like every id, as at training time. For a model
trained with item statistics (FeatureConfig.item_stats; off where the pipeline trains), a candidate's (its ad's
and campaign's counts) come from the store; one whose ad has no record there, or a
request scored while no store answers, scores with zero counts and is counted
(``genrank_serve_item_stats_defaulted_total``), never refused.
"""
from __future__ import annotations

import fcntl
import gc
import hashlib
import logging
import os
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import orjson
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError

from contracts import ACTIONS, CLICK_TYPES, ITEM_STAT_COLUMNS
from deploy.event_codec import EventArrays, encode, to_sample
from deploy.onnx_export import ONNX_FILE, ONNX_SHA256_TAG, OnnxScorer, ServingBundle, find_bundle, request_arrays
from deploy.prediction_log import LogLimits, PredictionLog
from deploy.request_body import decode_json, read_limited
from deploy.sequence_store import OnlineStore, StoreUnavailable, open_store
from deploy.service_metrics import ServiceMetrics
from models.config import StudentConfig
from models.data import request_tokens
from transforms.atomic import staged_dir

log = logging.getLogger("genrank.serve")


@dataclass(frozen=True)
class ServiceConfig:
    home: Path                       # GENRANK_HOME: the embedded online store and the model cache
    tracking_uri: str                # MLflow registry holding genrank-ctr
    store: str = ""                  # GENRANK_ONLINE_STORE: empty = LMDB under home, else a redis:// URL
    model_name: str = "genrank-ctr"
    alias: str = "champion"
    poll_s: float = 15.0             # how often the alias and the sequence store are re-read (0 = never)
    # onnxruntime intra-op threads (0 = its default, the physical cores). One: on 2 vCPUs a second thread made the
    # served graph ~3x slower even on an idle machine (threads spin at every node); scale out with workers.
    threads: int = 1
    max_candidates: int = 1000       # CADET scores hundreds of candidates per request
    max_history: int = 20000         # inline history events (TM20K's longest sequences)
    max_body_bytes: int = 8 << 20
    prediction_log: Path | None = None   # GENRANK_SERVE_PREDICTION_LOG: where scored requests are logged (None: not)
    prediction_log_limits: LogLimits = LogLimits()
    metrics_dir: Path | None = None      # PROMETHEUS_MULTIPROC_DIR: the workers' metric files (None: this process's)


# ------------------------------------------------------------------------------------------ schema

MAX_ID_BYTES = 256


def _at_most_256_bytes(value: str) -> str:
    if len(value.encode()) > MAX_ID_BYTES:
        raise ValueError(f"at most {MAX_ID_BYTES} bytes (UTF-8), got {len(value.encode())}")
    return value


# Ids may arrive as numbers; they are hashed as strings, like the ids in the logs (coerce_numbers_to_str below).
# Their byte limit is checked per column after validation (check_id_bytes): a Python validator on every id
# cost a request of 200 candidates ~1 ms, most of its validation time.
Id = Annotated[str, Field(min_length=1)]
Key = Annotated[StrictStr, Field(min_length=1), AfterValidator(_at_most_256_bytes)]  # store keys: strings only


class ItemFeatures(BaseModel):
    """The side features an ad or item carries (all optional: a missing one is a null id)."""
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    campaign_id: str | None = None
    advertiser_id: str | None = None
    category_id: str | None = None
    brand_id: str | None = None
    surface: str | None = None
    device: str | None = None


class Candidate(ItemFeatures):
    ad_id: Id


MAX_TS_MS = 4_102_444_800_000  # 2100-01-01: a bound that keeps every time arithmetic inside int64


class HistoryEvent(ItemFeatures):
    """An event as the sequence store holds it: an ad impression (with its outcome) or an organic action."""
    ts_ms: int = Field(ge=0, le=MAX_TS_MS)
    event_kind: Literal["impression", "behavior"]
    item_id: Id
    action: Literal[ACTIONS] | None = None
    position: int | None = Field(default=None, ge=1, le=10_000)
    label: Literal[0, 1] | None = None
    click_type: Literal[CLICK_TYPES] | None = None
    dwell_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: Key | None = None  # the ad server's (the landing logs'); the service makes one up without it
    user_id: Key | None = None
    history: list[HistoryEvent] | None = None
    candidates: list[Candidate] = Field(min_length=1)
    request_ts_ms: int | None = Field(default=None, ge=0, le=MAX_TS_MS)


class Refused(HTTPException):
    """A request the service does not score; ``reason`` is the kind of error the metrics count it under."""

    def __init__(self, status: int, reason: str, detail):
        super().__init__(status, detail)
        self.reason = reason


# deploy/request_body.py's refusals, by status: a body over the limit, a body that is not JSON
REQUEST_BODY_REASONS = {413: "body_too_large", 422: "invalid_json"}


# ------------------------------------------------------------------------------------------ models

@dataclass
class LoadedModel:
    version: str
    run_id: str
    bundle: ServingBundle
    config: StudentConfig
    scorer: OnnxScorer
    loaded_at: float


def verify_sha256(path: Path, expected: str | None, what: str) -> None:
    """Refuse a graph whose bytes are not the ones registered (a tampered artifact store or cache)."""
    if not expected:
        raise ValueError(f"{what} has no {ONNX_SHA256_TAG} tag: refusing to serve an unverifiable graph")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise ValueError(f"{what}: {path.name} has sha256 {digest}, the registry says {expected}: refusing it")


class ModelWatcher:
    """Holds the serving model and swaps it when the alias moves."""

    def __init__(self, cfg: ServiceConfig):
        from deploy.registry import Registry

        self.cfg = cfg
        self.registry = Registry(cfg.tracking_uri, cfg.home / "mlartifacts")
        self.current: LoadedModel | None = None
        self.last_error: str | None = None

    def refresh(self) -> bool:
        """Load the alias's version if it differs from the served one; True if swapped."""
        mv = self.registry.by_alias(self.cfg.model_name, self.cfg.alias)
        if mv is None or (self.current is not None and self.current.version == str(mv.version)):
            return False
        folder = self.cfg.home / "serving" / "models" / f"{self.cfg.model_name}-v{mv.version}"
        bundle = find_bundle(self._cached(folder, str(mv.version)))
        verify_sha256(bundle.onnx, mv.tags.get(ONNX_SHA256_TAG), f"{self.cfg.model_name} v{mv.version}")
        loaded = LoadedModel(str(mv.version), mv.run_id, bundle, bundle.student_config(),
                             OnnxScorer(bundle.onnx, self.cfg.threads), time.time())
        old, self.current = self.current, loaded
        log.info("serving %s v%s (was %s)", self.cfg.model_name, mv.version, old.version if old else "none")
        return True

    def _cached(self, folder: Path, version: str) -> Path:
        """The version's artifact folder in the serving cache, downloaded once. The workers of one `genrank serve`
        start together: the first takes the lock and downloads beside the folder, then renames (never a
        half-written cache); the others wait on the lock and find it there instead of replacing it under a
        worker that is loading it."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not any(folder.rglob(ONNX_FILE)):
                with staged_dir(folder) as tmp:
                    self.registry.artifact(self.cfg.model_name, version, tmp, ONNX_FILE)
        return folder


# ------------------------------------------------------------------------------------------ store

class StoreHandle:
    """The online store as the service holds it: reopened on refresh, kept when a replacement is unusable."""

    def __init__(self, cfg: ServiceConfig):
        self.cfg = cfg
        self.store: OnlineStore | None = None
        self.error: str | None = None
        self.as_of: str | None = None
        self.users = 0

    def refresh(self) -> None:
        try:
            if self.store is None:
                self.store = open_store(self.cfg.store, self.cfg.home)
            meta = self.store.refresh()
            self.as_of, self.users, self.error = meta.as_of, meta.users, None
        except StoreUnavailable as exc:  # keep the store already open, if any; say why in every 503
            self.error = str(exc)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def history(self, user_id: str, hash_key: str, counter_len: int | None) -> tuple[str, EventArrays | None]:
        if self.store is None:
            raise Refused(503, "store_unavailable", f"the online store is unavailable: {self.error}")
        try:
            meta, events = self.store.lookup(user_id)
        except StoreUnavailable as exc:
            raise Refused(503, "store_unavailable", f"the online store is unavailable: {exc}") from None
        if meta.hash_key != hash_key:
            raise Refused(503, "store_incompatible", f"the online store hashed ids with key {meta.hash_key!r}, the "
                                                      f"model with {hash_key!r}: rebuild the store for this model")
        if counter_len and meta.max_events < counter_len:  # the counters would count fewer events than in training
            raise Refused(503, "store_incompatible", f"the online store keeps {meta.max_events} events per user, the "
                                                      f"model's counters count {counter_len}: rebuild the store with "
                                                      f"max_events >= {counter_len}")
        return meta.as_of, events

    def item_stats(self, cols: dict[str, list]) -> tuple[np.ndarray, int]:
        """The candidates' item statistics and how many of them defaulted (all of them without a store)."""
        n = len(cols["ad_id"])
        if self.store is not None:
            try:
                return self.store.item_stats(cols["ad_id"], cols["campaign_id"])
            except StoreUnavailable:
                pass
        return np.zeros((n, len(ITEM_STAT_COLUMNS)), np.float32), n


# ------------------------------------------------------------------------------------------ requests

HISTORY_FIELDS = tuple(HistoryEvent.model_fields)
CANDIDATE_FIELDS = ("ad_id",) + tuple(ItemFeatures.model_fields)
ID_FIELDS = ("ad_id", "item_id") + tuple(ItemFeatures.model_fields)


def columns(items: list[BaseModel], fields: tuple[str, ...]) -> dict[str, list]:
    return {f: [getattr(item, f) for item in items] for f in fields}


def check_id_bytes(cols: dict[str, list], where: str) -> None:
    """A 422 naming the first id over MAX_ID_BYTES of UTF-8; only a column holding an id longer than a
    quarter of the limit (in characters) is encoded."""
    for field in ID_FIELDS:
        values = cols.get(field)
        if values and max(map(len, filter(None, values)), default=0) > MAX_ID_BYTES // 4:
            for i, value in enumerate(values):
                if value is not None and len(value.encode()) > MAX_ID_BYTES:
                    raise Refused(422, "id_too_long", f"{where}.{i}.{field}: at most {MAX_ID_BYTES} bytes (UTF-8), "
                                                      f"got {len(value.encode())}")


def _inline_history(cols: dict[str, list], hash_key: str) -> EventArrays:
    arrays = encode({f: np.array(v, dtype=object) for f, v in cols.items()}, hash_key)
    return arrays.take(np.argsort(arrays.ts, kind="stable"))


def candidate_events(cols: dict[str, list], ts_ms: int, hash_key: str) -> EventArrays:
    """The candidates' columns (``columns(candidates, CANDIDATE_FIELDS)``) as impressions at the request time."""
    n = len(cols["ad_id"])
    arrays = {f: np.array(v, dtype=object) for f, v in cols.items()}
    arrays.update(item_id=arrays.pop("ad_id"), ts_ms=np.full(n, ts_ms), event_kind=np.full(n, "impression", dtype=object))
    return encode(arrays, hash_key)


def _validation_422(exc: ValidationError) -> Refused:
    return Refused(422, "invalid_request", [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                                            for e in exc.errors(include_url=False, include_context=False,
                                                                include_input=False)])


def _json(payload, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


# ------------------------------------------------------------------------------------------ app

def create_app(cfg: ServiceConfig, watch: bool = True) -> FastAPI:
    """The app; ``watch=False`` leaves polling to the caller (tests call ``app.state.refresh()``)."""
    models = ModelWatcher(cfg)
    store = StoreHandle(cfg)
    metrics = ServiceMetrics(cfg.metrics_dir)
    prediction_log = None if cfg.prediction_log is None else PredictionLog(
        cfg.prediction_log, cfg.prediction_log_limits, on_drop=metrics.dropped, on_write=metrics.written)
    stop = threading.Event()

    def refresh() -> None:
        try:
            models.refresh()
            models.last_error = None
        except Exception as exc:  # a failed reload keeps serving the model it has
            models.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("model refresh failed; still serving %s",
                          models.current.version if models.current else "nothing")
        store.refresh()
        metrics.served(models.current.version if models.current else None, store.as_of)

    def watcher() -> None:
        while not stop.wait(cfg.poll_s):
            refresh()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        refresh()
        # Everything loaded so far (the libraries, the model, the store handle) lives as long as the worker:
        # out of the collector's reach, a full collection walks only what requests allocate (a few hundred
        # objects) instead of ~300,000, which took 200-250 ms, a pause in every few hundred requests' tail.
        gc.collect()
        gc.freeze()
        if watch and cfg.poll_s > 0:
            threading.Thread(target=watcher, name="genrank-model-watcher", daemon=True).start()
        if prediction_log is not None:
            prediction_log.start()
        yield
        stop.set()
        if prediction_log is not None:
            prediction_log.close()
        store.close()
        metrics.worker_exited()

    app = FastAPI(title="genrank scoring service", version="1", lifespan=lifespan)
    app.state.refresh = refresh
    app.state.models = models
    app.state.store = store
    app.state.metrics = metrics
    app.state.prediction_log = prediction_log

    @app.get("/healthz")
    def healthz():
        cur = models.current
        if cur is None:
            return JSONResponse(status_code=503, content={"status": "no model", "error": models.last_error})
        return {"status": "ok", "model_version": cur.version}

    @app.get("/v1/model")
    def model_info():
        cur = models.current
        if cur is None:
            raise HTTPException(503, f"no {cfg.model_name}@{cfg.alias} loaded yet ({models.last_error or 'none registered'})")
        c = cur.config
        return {"name": cfg.model_name, "alias": cfg.alias, "version": cur.version, "run_id": cur.run_id,
                "loaded_at": cur.loaded_at, "providers": cur.scorer.providers, "buckets": c.backbone.n_buckets,
                "max_history_events": c.max_len, "counter_events": c.counter_len, "delay_ms": c.mask.delay_ms,
                "worker_pid": os.getpid(),
                "sequence_store": {"as_of": store.as_of, "users": store.users, "error": store.error},
                "limits": {"max_candidates": cfg.max_candidates, "max_history": cfg.max_history,
                           "max_body_bytes": cfg.max_body_bytes},
                "last_refresh_error": models.last_error}

    @app.get("/metrics")
    def metrics_exposition() -> Response:
        metrics.served(models.current.version if models.current else None, store.as_of)  # staleness as of now
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def score_body(body: bytes) -> tuple[Response, dict]:
        """The answer to one request and its prediction-log record (all but the latency)."""
        try:
            req = ScoreRequest.model_validate(decode_json(body))
        except ValidationError as exc:
            raise _validation_422(exc) from None
        cur = models.current  # read once: a swap during this request does not affect it
        if cur is None:
            raise Refused(503, "no_model", f"no {cfg.model_name}@{cfg.alias} loaded yet")
        if len(req.candidates) > cfg.max_candidates:
            raise Refused(422, "too_many_candidates",
                          f"candidates: {len(req.candidates)} exceeds the limit of {cfg.max_candidates}")
        if req.history is not None and len(req.history) > cfg.max_history:
            raise Refused(422, "history_too_long",
                          f"history: {len(req.history)} events exceed the limit of {cfg.max_history}")
        if req.history is None and req.user_id is None:
            raise Refused(422, "no_user", "user_id: give a user_id (history from the sequence store) or an inline "
                                          "history (an empty list scores a new user)")
        cand_cols = columns(req.candidates, CANDIDATE_FIELDS)
        check_id_bytes(cand_cols, "candidates")
        hist_cols = None if req.history is None else columns(req.history, HISTORY_FIELDS)
        if hist_cols is not None:
            check_id_bytes(hist_cols, "history")
        c = cur.config
        key = c.features.hash_key
        as_of = store.as_of
        if hist_cols is not None:
            hist, source = _inline_history(hist_cols, key), "inline"
        else:
            as_of, hist = store.history(req.user_id, key, c.counter_len)
            if hist is None:
                raise Refused(404, "unknown_user", f"user {req.user_id!r} has no sequence in the store (as of "
                                                   f"{as_of}); send an inline history (history: [] scores a new user)")
            source = "store"
        ts = req.request_ts_ms if req.request_ts_ms is not None else int(time.time() * 1000)
        hist = hist.take(hist.ts <= ts)  # a request sees nothing from its own future
        candidates = to_sample(candidate_events(cand_cols, ts, key), c.features)
        if c.features.item_stats:
            candidates.item_stats, defaulted = store.item_stats(cand_cols)
            metrics.item_stats_defaulted(defaulted)
        tokens = request_tokens(to_sample(hist, c.features), candidates, c)
        probs = cur.scorer.score(request_arrays(tokens)).tolist()
        request_id = req.request_id or uuid.uuid4().hex
        response = _json({
            "request_id": request_id, "model_version": cur.version, "user_id": req.user_id, "history_source": source,
            "history_events": int(tokens.n_events), "history_tokens": int(tokens.n_groups), "request_ts_ms": ts,
            "buckets": len(probs[0]), "scores": [{"ad_id": cd.ad_id, "p": p} for cd, p in zip(req.candidates, probs)]})
        # the candidates as the columns the service already holds: no per-candidate work on the request path
        record = {"request_id": request_id, "ts_ms": ts, "user_id": req.user_id, "history_source": source,
                  "history_events": int(tokens.n_events), "candidates": cand_cols, "model_version": cur.version,
                  "scores": probs, "store_as_of": as_of, "worker_pid": os.getpid()}
        return response, record

    @app.post("/v1/score")
    async def score(request: Request) -> Response:
        start = time.perf_counter()
        try:
            body = await read_limited(request, cfg.max_body_bytes)
            # Scored on the event loop, one request at a time per worker: a busy worker stops accepting, so the
            # next connection waits in the kernel's queue for whichever worker is free (prefork), instead of
            # queueing behind this one or oversubscribing the cores with a second onnxruntime run.
            response, record = score_body(body)
        except HTTPException as exc:
            reason = exc.reason if isinstance(exc, Refused) else REQUEST_BODY_REASONS.get(exc.status_code, "other")
            metrics.answered(exc.status_code, reason)
            raise
        except Exception:
            metrics.answered(500, "internal")
            raise
        seconds = time.perf_counter() - start
        metrics.answered(200, seconds=seconds)
        if prediction_log is not None:
            record["latency_ms"] = round(seconds * 1000, 3)
            prediction_log.submit(record)
        return response

    return app
