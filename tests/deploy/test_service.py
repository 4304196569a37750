"""The scoring service against the real champion of a tiny pipeline run: scores equal the trained
model's with histories from the online store the run built, bad requests get a 4xx that says what is
wrong (never a 500), the store's failures a 503 that says why, the alias hot-swaps without dropping a
request (only to a graph whose sha256 matches its tag), also with several worker processes. Each test
works on a copy of the run's registry database and online store."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import orjson
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from contracts import ITEM_STAT_COLUMNS
from deploy import registry as reg
from deploy.onnx_export import ONNX_SHA256_TAG, torch_probs
from deploy.prediction_log import read_day
from deploy.replay import day_requests
from deploy.sequence_store import FORMAT_VERSION, ITEM_WINDOW_COUNTS, LmdbStore
from deploy.service import ServiceConfig, create_app
from deploy.stack import free_port
from models import load_model
from models.data import request_tokens, sample_from_frame
from transforms import landing

pytestmark = pytest.mark.slow

CANDIDATES = [{"ad_id": "ad-1", "campaign_id": "c1", "advertiser_id": "a1", "category_id": "cat-3",
               "brand_id": "b2", "surface": "feed", "device": "ios"},
              {"ad_id": 12345, "category_id": "never-seen-category"}]  # numeric and unknown ids are hashed


@pytest.fixture
def home(tiny_pipeline, tmp_path):
    src = tiny_pipeline[0]
    shutil.copy2(src / "mlflow.db", tmp_path / "mlflow.db")  # artifacts stay where the run logged them
    shutil.copytree(src / "online_store", tmp_path / "online_store")  # what the run's online_sequences built
    for dataset in ("user_sequences", "item_windows"):  # the reference
        shutil.copytree(src / "lake" / dataset, tmp_path / "lake" / dataset)
    return tmp_path


def _a_served_ad(home, store_day: str) -> tuple[dict, dict]:
    """A candidate whose ad and campaign the store published statistics for with ``store_day`` (the run of
    D exports them as lake/item_windows/date=D+1), and those statistics as the contract's columns."""
    served = pd.read_parquet(home / "lake" / "item_windows" /
                             f"date={(pd.Timestamp(store_day) + pd.Timedelta(days=1)).date()}")
    names = ITEM_WINDOW_COUNTS
    campaigns = served[served["level"] == "campaign"].set_index("key")
    ads = served[served["level"] == "ad"].set_index("key")
    seqs = pd.read_parquet(home / "lake" / "user_sequences").query("event_kind == 'impression'")
    pair = seqs[seqs["item_id"].isin(ads.index) & seqs["campaign_id"].isin(campaigns.index)].iloc[0]
    stats = {f"{level}_{n}": int(rows.loc[pair[key], n]) for level, rows, key in
             (("ad", ads, "item_id"), ("campaign", campaigns, "campaign_id")) for n in names}
    assert stats["ad_impressions_28d"] > 0
    return {"ad_id": pair["item_id"], "campaign_id": pair["campaign_id"], "category_id": pair["category_id"]}, stats


def _client(home, **overrides) -> TestClient:
    cfg = ServiceConfig(home=home, tracking_uri=f"sqlite:///{home / 'mlflow.db'}", threads=1, **overrides)
    return TestClient(create_app(cfg, watch=False), raise_server_exceptions=False)


def _a_user(home) -> tuple[str, int]:
    seqs = pd.read_parquet(home / "lake" / "user_sequences")
    user = seqs["user_id"].value_counts().index[0]
    return str(user), int(seqs["ts_ms"].max()) + 2 * 3_600_000


def test_scores_are_the_champions(home, tmp_path):
    r = reg.default_registry(home)
    champion = r.by_alias(reg.CTR, "champion")
    user, now = _a_user(home)
    with _client(home) as client:
        assert client.get("/healthz").json() == {"status": "ok", "model_version": str(champion.version)}
        info = client.get("/v1/model").json()
        assert info["version"] == str(champion.version) and info["sequence_store"]["users"] > 0
        served_ad, stats = _a_served_ad(home, info["sequence_store"]["as_of"])
        candidates = CANDIDATES + [served_ad]
        resp = client.post("/v1/score", json={"user_id": user, "candidates": candidates, "request_ts_ms": now})
        assert resp.status_code == 200, resp.text
        body = resp.json()
    assert body["model_version"] == str(champion.version) and body["history_source"] == "store"
    assert body["history_events"] > 0 and [s["ad_id"] for s in body["scores"]] == ["ad-1", "12345", served_ad["ad_id"]]
    probs = np.array([s["p"] for s in body["scores"]])
    assert probs.shape == (3, body["buckets"]) and ((probs > 0) & (probs < 1)).all()

    # the reference: the training code on the lake's history and the lake's item statistics for the served ad
    # (the unknown ads score with zero counts; a champion trained without them, as the pipeline's default is,
    # ignores them in both)
    model = load_model(str(r.checkpoint(reg.CTR, champion.version, tmp_path / "ckpt")))
    hist = pd.read_parquet(home / "lake" / "user_sequences").query("user_id == @user").sort_values("seq_index")
    cands = pd.DataFrame(candidates).rename(columns={"ad_id": "item_id"}).astype(object).assign(
        ts_ms=now, event_kind="impression", **{c: [0, 0, stats[c]] for c in ITEM_STAT_COLUMNS})
    cands["item_id"] = cands["item_id"].astype(str)
    tokens = request_tokens(sample_from_frame(hist, model.cfg.features),
                            sample_from_frame(cands, model.cfg.features), model.cfg)
    np.testing.assert_allclose(probs, torch_probs(model, tokens), atol=1e-4)


def test_inline_history_scores_like_the_store(home):
    user, now = _a_user(home)
    hist = pd.read_parquet(home / "lake" / "user_sequences").query("user_id == @user").sort_values("seq_index")
    events = [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in hist[
        ["ts_ms", "event_kind", "item_id", "campaign_id", "advertiser_id", "category_id", "brand_id", "surface",
         "device", "action", "position", "label", "click_type", "dwell_ms"]].to_dict("records")]
    with _client(home) as client:
        stored = client.post("/v1/score", json={"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now}).json()
        inline = client.post("/v1/score", json={"history": events, "candidates": CANDIDATES, "request_ts_ms": now})
        cold = client.post("/v1/score", json={"user_id": "new-user", "history": [], "candidates": CANDIDATES})
    assert inline.status_code == 200, inline.text
    assert inline.json()["history_source"] == "inline"
    np.testing.assert_allclose([s["p"] for s in inline.json()["scores"]], [s["p"] for s in stored["scores"]], atol=1e-6)
    assert cold.status_code == 200 and cold.json()["history_events"] == 0


@pytest.mark.parametrize("body, status, says", [
    (None, 422, "body"),                                                              # empty body
    ("{not json", 422, "json"),                                                       # malformed JSON
    ({"user_id": "u", "candidates": "ad-1"}, 422, "candidates"),                      # wrong type
    ({"user_id": "u", "candidates": []}, 422, "candidates"),                          # nothing to score
    ({"user_id": "u", "candidates": [{"ad_id": "x"}] * 6}, 422, "limit of 5"),        # too many candidates
    ({"history": [{"ts_ms": "noon", "event_kind": "impression", "item_id": "a"}], "candidates": [{"ad_id": "x"}]},
     422, "ts_ms"),
    ({"history": [{"ts_ms": 1, "event_kind": "purchase", "item_id": "a"}], "candidates": [{"ad_id": "x"}]},
     422, "event_kind"),
    ({"user_id": "u", "candidates": [{"ad_id": "x", "price": 3}]}, 422, "price"),     # unknown field
    ({"candidates": [{"ad_id": "x"}]}, 422, "user_id"),                               # neither user nor history
    ({"user_id": "nobody", "candidates": [{"ad_id": "x"}]}, 404, "no sequence"),      # unknown user, no history
    ('{"user_id": "u", "candidates": [{"ad_id": "x"}], "request_ts_ms": NaN}', 422, "request_ts_ms: non-finite"),
    ('{"history": [{"ts_ms": 1, "event_kind": "impression", "item_id": "a", "dwell_ms": -Infinity}], '
     '"candidates": [{"ad_id": "x"}]}', 422, "history.0.dwell_ms: non-finite"),
    ('{"user_id": "u", "candidates": [{"ad_id": "x"}], "request_ts_ms": 1e999}', 422, "request_ts_ms: non-finite"),
    ({"user_id": "\u00e9" * 129, "candidates": [{"ad_id": "x"}]}, 422, "256 bytes"),  # 258 bytes of UTF-8
    ({"user_id": 42, "candidates": [{"ad_id": "x"}]}, 422, "user_id"),               # not a string
    ({"user_id": "u", "candidates": [{"ad_id": "x"}, {"ad_id": "y", "brand_id": "\u00e9" * 129}]},  # an id of 258
     422, "candidates.1.brand_id: at most 256 bytes"),                                # bytes, 129 characters
    ({"history": [{"ts_ms": 1, "event_kind": "behavior", "item_id": "i" * 257}], "candidates": [{"ad_id": "x"}]},
     422, "history.0.item_id: at most 256 bytes"),
    ({"user_id": "u", "candidates": [{"ad_id": True}]}, 422, "ad_id"),                # a boolean is not an id
])
def test_bad_requests_get_a_4xx_that_says_what_is_wrong(home, body, status, says):
    with _client(home, max_candidates=5) as client:
        if body is None:
            resp = client.post("/v1/score")
        elif isinstance(body, str):
            resp = client.post("/v1/score", content=body, headers={"content-type": "application/json"})
        else:
            resp = client.post("/v1/score", json=body)
    assert resp.status_code == status, resp.text
    assert says.lower() in resp.text.lower()


SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=6) | st.sampled_from(["impression", "behavior", "view", "1", ""]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)
EVENT_KEYS = ["ts_ms", "event_kind", "item_id", "category_id", "action", "position", "label", "dwell_ms", "oops"]
BODIES = st.fixed_dictionaries({}, optional={
    "user_id": JSON, "request_ts_ms": JSON | st.integers(0, 2**62),
    "history": st.lists(st.dictionaries(st.sampled_from(EVENT_KEYS), JSON | st.integers(0, 2**62)), max_size=4) | JSON,
    "candidates": st.lists(st.dictionaries(st.sampled_from(["ad_id", "brand_id", "device", "x"]), JSON), max_size=4) | JSON,
})


def test_no_request_body_gets_a_500(home):
    """Whatever the client sends, the answer is a 2xx or a 4xx (property-based)."""
    with _client(home) as client:
        @settings(max_examples=150, deadline=None)
        @given(body=BODIES)
        def check(body):
            resp = client.post("/v1/score", json=body)
            assert resp.status_code < 500, (body, resp.text)

        check()


def test_oversized_bodies_are_refused_before_parsing(home):
    def chunks():  # no Content-Length: Transfer-Encoding: chunked
        for _ in range(100):
            yield b"x" * 300

    with _client(home, max_body_bytes=1000) as client:
        resp = client.post("/v1/score", json={"user_id": "u", "candidates": [{"ad_id": "x" * 200}] * 10})
        chunked = client.post("/v1/score", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "limit of 1000 bytes" in resp.text
    assert chunked.status_code == 413 and "limit of 1000 bytes" in chunked.text, chunked.text


def test_a_missing_or_foreign_store_gets_a_503_that_says_why(home):
    user, now = _a_user(home)
    body = {"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now}
    shutil.move(home / "online_store", home / "kept")
    with _client(home) as client:
        missing = client.post("/v1/score", json=body)
        inline = client.post("/v1/score", json={**body, "user_id": None, "history": []})
    assert missing.status_code == 503 and "no online store" in missing.text and inline.status_code == 200
    shutil.move(home / "kept", home / "online_store")
    writer = LmdbStore(home / "online_store", readonly=False)
    with writer._env.begin(write=True) as txn:
        meta = json.loads(txn.get(LmdbStore.META))
        txn.put(LmdbStore.META, json.dumps({**meta, "format_version": FORMAT_VERSION + 1}).encode())
    writer.close()
    with _client(home) as client:
        foreign = client.post("/v1/score", json=body)
    assert foreign.status_code == 503 and f"format version {FORMAT_VERSION + 1}" in foreign.text
    writer = LmdbStore(home / "online_store", readonly=False)  # a store that keeps fewer events than the counters count
    with writer._env.begin(write=True) as txn:
        txn.put(LmdbStore.META, json.dumps({**meta, "max_events": 3}).encode())
    writer.close()
    with _client(home) as client:
        counted = client.get("/v1/model").json()["counter_events"]
        short = client.post("/v1/score", json=body)
    assert counted > 3 and short.status_code == 503 and f"max_events >= {counted}" in short.text


def test_a_store_removed_under_the_service_keeps_serving_the_one_it_opened(home):
    user, now = _a_user(home)
    with _client(home) as client:
        shutil.rmtree(home / "online_store")
        client.app.state.refresh()
        resp = client.post("/v1/score", json={"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now})
        info = client.get("/v1/model").json()
    assert resp.status_code == 200 and resp.json()["history_source"] == "store"
    assert "removed or replaced" in info["sequence_store"]["error"]


def _champion_and_another(home) -> tuple[reg.Registry, str, str]:
    """The registry, the champion's version and another version of the session's run."""
    r = reg.default_registry(home)
    old = str(r.by_alias(reg.CTR, "champion").version)
    other = next(str(v.version) for v in r.client.search_model_versions(f"name = '{reg.CTR}'") if str(v.version) != old)
    return r, old, other


def test_a_moved_alias_is_hot_swapped_without_dropping_requests(home):
    r, old, other = _champion_and_another(home)
    user, now = _a_user(home)
    statuses, versions, stop = [], set(), threading.Event()
    with _client(home) as client:
        def fire():
            while not stop.is_set():
                resp = client.post("/v1/score", json={"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now})
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    versions.add(resp.json()["model_version"])
        shooter = threading.Thread(target=fire)
        shooter.start()
        while len(statuses) < 3:
            threading.Event().wait(0.05)
        r.client.set_registered_model_alias(reg.CTR, "champion", other)
        client.app.state.refresh()
        n_at_swap = len(statuses)
        while len(statuses) < n_at_swap + 3:
            threading.Event().wait(0.05)
        stop.set()
        shooter.join()
        info = client.get("/v1/model").json()
        assert info["version"] == other, info["last_refresh_error"]
    assert set(statuses) == {200} and versions == {old, other}


def test_a_graph_that_does_not_match_its_sha256_tag_is_not_swapped_in(home):
    r, old, other = _champion_and_another(home)
    r.client.set_model_version_tag(reg.CTR, other, ONNX_SHA256_TAG, "0" * 64)  # what a tampered artifact looks like
    with _client(home) as client:
        r.client.set_registered_model_alias(reg.CTR, "champion", other)
        client.app.state.refresh()
        info = client.get("/v1/model").json()
    assert info["version"] == old and "sha256" in info["last_refresh_error"]


def _start_a_worker(home, barrier, answers) -> None:
    """What a worker of `genrank serve` does first, after the other workers reached the same point."""
    from deploy.service import ModelWatcher

    watcher = ModelWatcher(ServiceConfig(home=home, tracking_uri=f"sqlite:///{home / 'mlflow.db'}", threads=1))
    barrier.wait()
    try:
        watcher.refresh()
        answers.put(watcher.current.version)
    except Exception as exc:  # noqa: BLE001 - the test names it
        answers.put(f"{type(exc).__name__}: {exc}")


def test_workers_starting_together_download_the_champion_once_and_each_load_it(home, monkeypatch):
    """The race of `genrank serve --workers N` at start-up: every worker finds the version's cache folder empty.
    One downloads it; the others wait and load that copy, instead of replacing the folder under a worker that is
    reading it (a worker that lost that race served 503s until its next poll). The download is slowed down so that
    the workers all look while the first is still fetching."""
    import multiprocessing

    downloads = home / "downloads.txt"
    fetch = reg.Registry.artifact

    def slow_fetch(self, *args, **kwargs):
        with open(downloads, "a") as f:
            f.write(f"{os.getpid()}\n")
        got = fetch(self, *args, **kwargs)
        time.sleep(1.0)
        return got

    monkeypatch.setattr(reg.Registry, "artifact", slow_fetch)
    fork = multiprocessing.get_context("fork")   # the patch travels with the workers
    barrier, answers = fork.Barrier(3), fork.Queue()
    workers = [fork.Process(target=_start_a_worker, args=(home, barrier, answers)) for _ in range(3)]
    for w in workers:
        w.start()
    loaded = sorted(answers.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(30)
    champion = str(reg.default_registry(home).by_alias(reg.CTR, "champion").version)
    assert loaded == [champion] * 3
    assert len(downloads.read_text().split()) == 1
    assert [p.name for p in (home / "serving" / "models").iterdir() if not p.name.startswith(".")] == \
        [f"{reg.CTR}-v{champion}"]


@contextlib.contextmanager
def _serving(home, **variables):
    """`genrank serve --workers 2` on a free loopback port, answering /healthz: (client, url), the client opening a
    new connection per request so that requests spread over the workers; stopped by its PID (the workers drain)."""
    import httpx

    port = free_port()
    env = {**os.environ, "GENRANK_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
           "GENRANK_SERVE_THREADS": "1", **variables}
    env.pop("GENRANK_ONLINE_STORE", None)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "serve", "--home", str(home), "--port", str(port),
                             "--workers", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30, headers={"connection": "close"}) as client:
            deadline = time.time() + 120
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.time() < deadline, "genrank serve --workers 2 did not start"
                time.sleep(0.2)
            yield client, url
    finally:
        proc.terminate()
        proc.wait(30)


def test_several_workers_keep_every_rule_and_hot_swap(home):
    """`genrank serve --workers 2`: each worker answers the 4xx rules and picks up a moved alias."""
    r, old, other = _champion_and_another(home)
    user, now = _a_user(home)
    with _serving(home, GENRANK_SERVE_POLL_S="0.3", GENRANK_SERVE_MAX_BODY_BYTES="4000") as (client, _):
        def versions_by_worker() -> dict[int, str]:
            seen, deadline = {}, time.time() + 60
            while len(seen) < 2:
                info = client.get("/v1/model").json()
                seen[info["worker_pid"]] = info["version"]
                assert time.time() < deadline, f"only worker(s) {list(seen)} answered"
            return seen

        body = {"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now}
        assert set(versions_by_worker().values()) == {old}
        for _ in range(6):  # the rules, whichever worker answers
            assert client.post("/v1/score", json=body).status_code == 200
            nan = client.post("/v1/score", content=b'{"user_id": "u", "candidates": [], "request_ts_ms": NaN}')
            assert nan.status_code == 422 and "request_ts_ms" in nan.text
            big = client.post("/v1/score", content=(b"x" * 1000 for _ in range(10)))
            assert big.status_code == 413
            assert client.post("/v1/score", json={**body, "user_id": "x" * 257}).status_code == 422
        r.client.set_registered_model_alias(reg.CTR, "champion", other)
        deadline = time.time() + 60
        while set(seen := versions_by_worker().values()) != {other}:
            assert client.post("/v1/score", json=body).status_code == 200
            assert time.time() < deadline, seen


def test_a_worker_freezes_what_it_loaded_at_start_up(home):
    """Start-up objects out of the collector's reach: a full collection no longer walks them mid-request."""
    gc.unfreeze()  # whatever an earlier app of this process froze
    assert gc.get_freeze_count() == 0
    with _client(home) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 0


def test_without_a_champion_the_service_says_so(tmp_path):
    with _client(tmp_path) as client:
        assert client.get("/healthz").status_code == 503
        resp = client.post("/v1/score", json={"history": [], "candidates": [{"ad_id": "x"}]})
    assert resp.status_code == 503 and "no genrank-ctr@champion" in resp.text


def _samples(text: str) -> dict[tuple, float]:
    """A /metrics exposition as {(sample name, sorted labels without pid): value}, summed over workers' pids."""
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid")))
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_metrics_count_a_known_sequence_of_requests_and_the_log_holds_the_scored_ones(home, tmp_path):
    user, now = _a_user(home)
    body = {"user_id": user, "candidates": CANDIDATES, "request_ts_ms": now}
    champion = str(reg.default_registry(home).by_alias(reg.CTR, "champion").version)
    plog = tmp_path / "plog"
    with _client(home, max_candidates=5, max_body_bytes=3000, prediction_log=plog) as client:
        scored = [client.post("/v1/score", json={**body, "request_id": "req-1"}),
                  client.post("/v1/score", json=body),
                  client.post("/v1/score", json={**body, "user_id": None, "history": []})]
        refused = [client.post("/v1/score", json={**body, "candidates": [{"ad_id": "x"}] * 6}),  # 422 too many
                   client.post("/v1/score", content=b"{not json"),                                 # 422 malformed
                   client.post("/v1/score", json={**body, "candidates": [{"ad_id": "x" * 700}] * 5}),  # 413
                   client.post("/v1/score", json={**body, "user_id": "nobody"})]                   # 404
        assert [r.status_code for r in scored + refused] == [200, 200, 200, 422, 422, 413, 404]
        client.app.state.prediction_log.flush()
        before = time.time()
        metrics = _samples(client.get("/metrics").text)
        after = time.time()
    as_of = client.app.state.store.as_of
    assert {k: v for k, v in metrics.items() if k[0] in ("genrank_serve_requests_total", "genrank_serve_errors_total")} == {
        ("genrank_serve_requests_total", (("status", "200"),)): 3,
        ("genrank_serve_requests_total", (("status", "422"),)): 2,
        ("genrank_serve_requests_total", (("status", "413"),)): 1,
        ("genrank_serve_requests_total", (("status", "404"),)): 1,
        ("genrank_serve_errors_total", (("reason", "too_many_candidates"), ("status", "422"))): 1,
        ("genrank_serve_errors_total", (("reason", "invalid_json"), ("status", "422"))): 1,
        ("genrank_serve_errors_total", (("reason", "body_too_large"), ("status", "413"))): 1,
        ("genrank_serve_errors_total", (("reason", "unknown_user"), ("status", "404"))): 1}
    assert metrics[("genrank_serve_request_duration_seconds_count", ())] == 3
    assert metrics[("genrank_serve_request_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert metrics[("genrank_serve_model_version", ())] == int(champion)
    day_start = pd.Timestamp(as_of, tz="UTC").timestamp()
    assert metrics[("genrank_serve_store_day_timestamp_seconds", ())] == day_start
    assert before - day_start - 86400 <= metrics[("genrank_serve_store_staleness_seconds", ())] <= after - day_start - 86400
    assert metrics[("genrank_serve_prediction_log_records_total", ())] == 3
    assert not any(k[0] == "genrank_serve_prediction_log_dropped_total" for k in metrics)
    # the champion trains without item statistics (FeatureConfig.item_stats, off where the pipeline trains): the
    # service looks none up, so none is defaulted
    assert metrics[("genrank_serve_item_stats_defaulted_total", ())] == 0

    logged = {r["request_id"]: r for r in read_day(plog, pd.Timestamp(now, unit="ms").date().isoformat())}
    answers = {r.json()["request_id"]: r.json() for r in scored}
    assert "req-1" in answers and set(logged) == set(answers)
    for request_id, r in logged.items():
        a = answers[request_id]
        assert r["model_version"] == champion and r["ts_ms"] == now and r["latency_ms"] > 0
        assert r["scores"] == [s["p"] for s in a["scores"]] and r["history_source"] == a["history_source"]
        assert r["candidates"]["ad_id"] == ["ad-1", "12345"] and r["store_as_of"] == as_of
        assert r["user_id"] == a["user_id"] and r["history_events"] == a["history_events"]


def test_a_log_that_cannot_be_written_is_counted_as_drops_while_requests_are_scored(home, tmp_path):
    user, now = _a_user(home)
    blocked = tmp_path / "plog"
    blocked.write_text("a file where the log's directory should be")
    with _client(home, prediction_log=blocked) as client:
        statuses = [client.post("/v1/score", json={"user_id": user, "candidates": CANDIDATES}).status_code
                    for _ in range(3)]
        client.app.state.prediction_log.flush()
        metrics = _samples(client.get("/metrics").text)
    assert statuses == [200] * 3
    assert metrics[("genrank_serve_prediction_log_dropped_total", (("reason", "write_error"),))] == 3


def test_replay_sends_a_landing_day_through_the_workers_and_metrics_and_log_add_up(home, tiny_pipeline, tmp_path):
    """`genrank replay` against `genrank serve --workers 2`: the day's lines the events job quarantined are skipped
    for the same reasons, every answer is counted once in /metrics whichever worker answers the scrape, and the
    prediction log holds each scored request once."""
    src = tiny_pipeline[0]
    day = landing.complete_days(src)[-1]
    found = day_requests(src, day)
    quarantined = pd.read_parquet(src / "lake" / "quarantine" / f"date={day}").query("kind == 'impressions'")
    rejected = {reason: n for reason, n in found.skipped.items() if reason != "duplicate_impression_id"}
    assert rejected == quarantined["reason"].value_counts().to_dict()
    assert len(found.bodies) > 60
    plog = tmp_path / "plog"
    with _serving(home, GENRANK_SERVE_PREDICTION_LOG=str(plog)) as (client, url):
        out = subprocess.run([sys.executable, "-m", "pipelines.cli", "replay", "--day", day, "--url", url,
                              "--home", str(src), "--max-requests", "60"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        sent, ok, c4xx, c5xx = map(int, re.search(r"sent (\d+)\s+ok (\d+)\s+4xx (\d+)\s+5xx (\d+)", out.stdout).groups())
        assert (sent, ok + c4xx, c5xx) == (60, 60, 0) and ok > 0, out.stdout
        assert f"not sent {len(found.bodies) - 60}" in out.stdout

        deadline = time.time() + 60
        while True:  # both workers' gauges, and every record written (the writers run beside the requests)
            metrics = _samples(text := client.get("/metrics").text)
            workers = {s.labels["pid"] for f in text_string_to_metric_families(text)
                       if f.name == "genrank_serve_model_version" for s in f.samples}
            if len(workers) == 2 and metrics.get(("genrank_serve_prediction_log_records_total", ())) == ok:
                break
            assert time.time() < deadline, (workers, metrics)
            time.sleep(0.2)
        for _ in range(4):  # whichever worker answers, the same sums
            metrics = _samples(client.get("/metrics").text)
            assert metrics[("genrank_serve_requests_total", (("status", "200"),))] == ok
            assert sum(v for (name, labels), v in metrics.items()
                       if name == "genrank_serve_requests_total" and labels[0][1].startswith("4")) == c4xx
            assert metrics[("genrank_serve_request_duration_seconds_count", ())] == ok
    records = read_day(plog, day)
    sent_ids = [orjson.loads(b)["request_id"] for b in found.bodies[:60]]
    assert len(records) == ok and len({r["request_id"] for r in records}) == ok
    assert {r["request_id"] for r in records} <= set(sent_ids)
    bodies = {orjson.loads(b)["request_id"]: orjson.loads(b) for b in found.bodies[:60]}
    for r in records:  # the candidates as the ad server showed them, scored at the request's time
        asked = bodies[r["request_id"]]
        assert r["candidates"]["ad_id"] == [c["ad_id"] for c in asked["candidates"]]
        assert r["ts_ms"] == asked["request_ts_ms"] and len(r["scores"]) == len(asked["candidates"])
