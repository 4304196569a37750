"""The scoring service: FastAPI over onnxruntime, serving ``models:/genrank-ctr@champion``.

    POST /v1/score   one request: a user (history from the sequence store) or an inline history, and
                     up to max_candidates ads; returns P(click | position bucket k) per candidate and
                     the model version that scored it
    GET  /healthz    200 once a model is loaded, 503 before
    GET  /v1/model   the loaded version, its config, providers and the sequence store's day

Hot swap: a watcher thread polls the champion alias (and the sequence store) every ``poll_s``; a new
champion is downloaded and its onnxruntime session built beside the old one, then one reference is
swapped. A request reads that reference once, so requests in flight finish on the model they started
with and none is dropped.

Bad input is the client's problem and says so: malformed JSON, wrong types, unknown fields, too many
candidates or history events get a 422 that names the field; a body over the size limit a 413; an
unknown user without an inline history a 404 (send ``history: []`` to score a new user cold). Unknown
ad, campaign or category ids are not errors: they are hashed like every id, as at training time.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from deploy.onnx_export import ONNX_FILE, OnnxScorer, ServingBundle, find_bundle, request_arrays
from deploy.sequence_store import SequenceStore
from models.config import StudentConfig
from models.data import request_tokens, sample_from_frame

log = logging.getLogger("genrank.serve")


@dataclass(frozen=True)
class ServiceConfig:
    home: Path                       # GENRANK_HOME: lake/ (sequence store) and the model cache
    tracking_uri: str                # MLflow registry holding genrank-ctr
    model_name: str = "genrank-ctr"
    alias: str = "champion"
    poll_s: float = 15.0             # how often the alias and the sequence store are re-read (0 = never)
    threads: int = 0                 # onnxruntime intra-op threads (0 = its default: the physical cores)
    max_candidates: int = 1000       # CADET scores hundreds of candidates per request
    max_history: int = 20000         # inline history events (TM20K's longest sequences)
    max_body_bytes: int = 8 << 20


# ------------------------------------------------------------------------------------------ schema

def _id(value):
    """Ids may arrive as numbers; they are hashed as strings, like the ids in the logs."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Id = Annotated[str, BeforeValidator(_id), Field(min_length=1, max_length=256)]
OptId = Annotated[str, BeforeValidator(_id), Field(max_length=256)] | None


class ItemFeatures(BaseModel):
    """The side features an ad or item carries (all optional: a missing one is a null id)."""
    model_config = ConfigDict(extra="forbid")
    campaign_id: OptId = None
    advertiser_id: OptId = None
    category_id: OptId = None
    brand_id: OptId = None
    surface: OptId = None
    device: OptId = None


class Candidate(ItemFeatures):
    ad_id: Id


MAX_TS_MS = 4_102_444_800_000  # 2100-01-01: a bound that keeps every time arithmetic inside int64


class HistoryEvent(ItemFeatures):
    """An event as the sequence store holds it: an ad impression (with its outcome) or an organic action."""
    ts_ms: int = Field(ge=0, le=MAX_TS_MS)
    event_kind: Literal["impression", "behavior"]
    item_id: Id
    action: Literal["view", "cart", "fav", "buy"] | None = None
    position: int | None = Field(default=None, ge=1, le=10_000)
    label: Literal[0, 1] | None = None
    click_type: Literal["view_details", "add_to_cart", "follow"] | None = None
    dwell_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: OptId = None
    history: list[HistoryEvent] | None = None
    candidates: list[Candidate] = Field(min_length=1)
    request_ts_ms: int | None = Field(default=None, ge=0, le=MAX_TS_MS)


class CandidateScore(BaseModel):
    ad_id: str
    p: list[float]  # P(click | the ad shown in position bucket k), k = 0..K-1


class ScoreResponse(BaseModel):
    model_version: str
    user_id: str | None
    history_source: Literal["store", "inline"]
    history_events: int
    history_tokens: int
    request_ts_ms: int
    buckets: int
    scores: list[CandidateScore]


# ------------------------------------------------------------------------------------------ models

@dataclass
class LoadedModel:
    version: str
    run_id: str
    bundle: ServingBundle
    config: StudentConfig
    scorer: OnnxScorer
    loaded_at: float


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
        if not any(folder.rglob(ONNX_FILE)):  # download beside, then rename: never a half-written cache
            tmp = folder.with_name(f"{folder.name}.tmp-{time.time_ns()}")
            self.registry.artifact(self.cfg.model_name, mv.version, tmp, ONNX_FILE)
            shutil.rmtree(folder, ignore_errors=True)
            tmp.replace(folder)
        bundle = find_bundle(folder)
        loaded = LoadedModel(str(mv.version), mv.run_id, bundle, bundle.student_config(),
                             OnnxScorer(bundle.onnx, self.cfg.threads), time.time())
        old, self.current = self.current, loaded
        log.info("serving %s v%s (was %s)", self.cfg.model_name, mv.version, old.version if old else "none")
        return True


# ------------------------------------------------------------------------------------------ app

def _history_frame(events: list[HistoryEvent]) -> pd.DataFrame:
    rows = [e.model_dump() for e in events]
    df = pd.DataFrame(rows, columns=list(HistoryEvent.model_fields))
    return df.sort_values("ts_ms", kind="stable").reset_index(drop=True)


def _candidate_frame(cands: list[Candidate], ts_ms: int) -> pd.DataFrame:
    df = pd.DataFrame([c.model_dump() for c in cands], columns=list(Candidate.model_fields))
    return df.rename(columns={"ad_id": "item_id"}).assign(ts_ms=ts_ms, event_kind="impression")


def create_app(cfg: ServiceConfig, watch: bool = True) -> FastAPI:
    """The app; ``watch=False`` leaves polling to the caller (tests call ``app.state.refresh()``)."""
    models = ModelWatcher(cfg)
    store: dict[str, SequenceStore] = {}
    stop = threading.Event()

    def refresh() -> None:
        try:
            models.refresh()
            cur = models.current
            if cur is not None:
                max_len = cur.config.max_len
                if "s" not in store or store["s"].max_events != max_len:
                    store["s"] = SequenceStore(cfg.home / "lake", max_len)
                store["s"].refresh()
            models.last_error = None
        except Exception as exc:  # a failed reload keeps serving the model it has
            models.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("model / store refresh failed; still serving %s",
                          models.current.version if models.current else "nothing")

    def watcher() -> None:
        while not stop.wait(cfg.poll_s):
            refresh()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        refresh()
        if watch and cfg.poll_s > 0:
            threading.Thread(target=watcher, name="genrank-model-watcher", daemon=True).start()
        yield
        stop.set()

    app = FastAPI(title="genrank scoring service", version="1", lifespan=lifespan)
    app.state.refresh = refresh
    app.state.models = models
    app.state.store = store

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return JSONResponse(status_code=413, content={
                "detail": f"request body of {length} bytes exceeds the limit of {cfg.max_body_bytes} bytes"})
        return await call_next(request)

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
        s = store.get("s")
        c = cur.config
        return {"name": cfg.model_name, "alias": cfg.alias, "version": cur.version, "run_id": cur.run_id,
                "loaded_at": cur.loaded_at, "providers": cur.scorer.providers, "buckets": c.backbone.n_buckets,
                "max_history_events": c.max_len, "delay_ms": c.mask.delay_ms,
                "sequence_store": {"as_of": s.as_of if s else None, "users": s.n_users if s else 0},
                "limits": {"max_candidates": cfg.max_candidates, "max_history": cfg.max_history,
                           "max_body_bytes": cfg.max_body_bytes},
                "last_refresh_error": models.last_error}

    @app.post("/v1/score", response_model=ScoreResponse)
    def score(req: ScoreRequest):
        cur = models.current  # read once: a swap during this request does not affect it
        if cur is None:
            raise HTTPException(503, f"no {cfg.model_name}@{cfg.alias} loaded yet")
        if len(req.candidates) > cfg.max_candidates:
            raise HTTPException(422, f"candidates: {len(req.candidates)} exceeds the limit of {cfg.max_candidates}")
        if req.history is not None and len(req.history) > cfg.max_history:
            raise HTTPException(422, f"history: {len(req.history)} events exceed the limit of {cfg.max_history}")
        if req.history is None and req.user_id is None:
            raise HTTPException(422, "give a user_id (history from the sequence store) or an inline history "
                                     "(an empty list scores a new user)")
        c = cur.config
        if req.history is not None:
            hist, source = _history_frame(req.history), "inline"
        else:
            s = store.get("s")
            hist = s.history(req.user_id) if s is not None else None
            if hist is None:
                raise HTTPException(404, f"user {req.user_id!r} has no sequence in the store (as of "
                                         f"{s.as_of if s else 'never built'}); send an inline history "
                                         "(history: [] scores a new user)")
            source = "store"
        ts = req.request_ts_ms if req.request_ts_ms is not None else int(time.time() * 1000)
        hist = hist[hist["ts_ms"] <= ts]  # a request sees nothing from its own future
        tokens = request_tokens(sample_from_frame(hist, c.features), sample_from_frame(
            _candidate_frame(req.candidates, ts), c.features), c)
        probs = cur.scorer.score(request_arrays(tokens))
        return ScoreResponse(
            model_version=cur.version, user_id=req.user_id, history_source=source,
            history_events=int(tokens.n_events), history_tokens=int(tokens.n_groups), request_ts_ms=ts,
            buckets=int(probs.shape[1]),
            scores=[CandidateScore(ad_id=cd.ad_id, p=[float(x) for x in np.asarray(row)])
                    for cd, row in zip(req.candidates, probs)])

    return app
