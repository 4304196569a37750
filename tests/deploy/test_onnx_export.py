"""The exported ONNX graph is the trained student: parity with Student.forward (the specification)
over random histories and candidate sets, cold starts, and candidate isolation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.onnx_export import (PARITY_TOLERANCE, OnnxScorer, RequestScorer, export_onnx, find_bundle,
                                latency_p99_ms, request_arrays, torch_probs, write_bundle)
from contracts import ITEM_STAT_COLUMNS
from models import preset
from models.data import request_tokens, sample_from_frame
from models.student import Student

HOUR = 3_600_000
DAY = 24 * HOUR


def _student(rope: str) -> Student:
    """A tiny student with 4 layers (so LPTM merges once, before layer 2) and weights spread wide
    enough that probabilities vary across candidates: parity of near-constant outputs proves little."""
    _, cfg, _ = preset("tiny")
    cfg = dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, n_layers=4),
                              rope=dataclasses.replace(cfg.rope, mode=rope, dt_max_s=86400.0),
                              features=dataclasses.replace(cfg.features, item_stats=True))   # the wider cand_cross
    torch.manual_seed(1)
    m = Student(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.15)
    return m


@pytest.fixture(scope="module", params=["time", "index"])
def exported(request, tmp_path_factory):
    m = _student(request.param)
    path = export_onnx(m, tmp_path_factory.mktemp(f"onnx-{request.param}") / "model.onnx")
    return m, OnnxScorer(path, threads=1)


def _events(rng, n: int, t0: int, t1: int, kind=None) -> pd.DataFrame:
    items = [f"ad{x}" for x in rng.integers(0, max(2, n // 3 + 1), n)]  # repeats, so LITM merges
    return pd.DataFrame({
        "user_id": "u", "ts_ms": np.sort(rng.integers(t0, t1, n)),
        "event_kind": rng.choice(["impression", "behavior"], n) if kind is None else kind,
        "item_id": items, "campaign_id": [f"c{x}" for x in rng.integers(0, 6, n)],
        "advertiser_id": [f"a{x}" for x in rng.integers(0, 4, n)], "category_id": [f"k{x}" for x in rng.integers(0, 9, n)],
        "brand_id": [f"b{x}" for x in rng.integers(0, 5, n)], "surface": rng.choice(["feed", "search"], n),
        "device": rng.choice(["ios", "android", None], n), "action": rng.choice(["view", "cart", "fav", "buy"], n),
        "position": rng.integers(1, 12, n), "label": rng.integers(0, 2, n),
        "click_type": rng.choice(["view_details", "add_to_cart", None], n),
        "dwell_ms": np.where(rng.random(n) < 0.5, rng.exponential(20_000, n), np.nan),
    })


def _request(m: Student, seed: int, n_hist: int, n_cand: int, recent_hours: float):
    rng = np.random.default_rng(seed)
    now = 30 * DAY
    # history spans weeks, and part of it falls inside the delay window (invisible to the candidates)
    hist = _events(rng, n_hist, now - 20 * DAY, now - int(recent_hours * HOUR) + 1)
    cands = _events(rng, n_cand, now, now + 1, kind="impression").assign(ts_ms=now)
    shown = rng.integers(0, 3000, (n_cand, len(ITEM_STAT_COLUMNS)))   # the store's item statistics
    cands = cands.assign(**{c: shown[:, j - ("clicks" in c)] // (20 if "clicks" in c else 1)
                            for j, c in enumerate(ITEM_STAT_COLUMNS)})   # a window's clicks: its impressions / 20
    return request_tokens(sample_from_frame(hist, m.cfg.features), sample_from_frame(cands, m.cfg.features), m.cfg)


def test_the_traced_module_is_the_specification():
    m = _student("time")
    tokens = _request(m, 0, 400, 30, 0.5)
    a = {k: torch.from_numpy(v) for k, v in request_arrays(tokens).items()}
    assert a["cand_cross"].abs().sum() > 0  # the candidates' cross features are inputs, and not all zero
    with torch.no_grad():
        got = RequestScorer(m)(**a).numpy()
    want = torch_probs(m, tokens)
    assert want.std() > 0.01  # the outputs really vary
    np.testing.assert_allclose(got, want, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_hist=st.integers(0, 700), n_cand=st.integers(1, 80),
       recent_hours=st.floats(0.0, 6.0))
def test_onnx_matches_torch_on_random_requests(exported, seed, n_hist, n_cand, recent_hours):
    m, scorer = exported
    tokens = _request(m, seed, n_hist, n_cand, recent_hours)
    got, want = scorer.score_tokens(tokens), torch_probs(m, tokens)
    assert got.shape == (n_cand, m.cfg.backbone.n_buckets)
    assert np.abs(got - want).max() <= PARITY_TOLERANCE


def test_candidates_never_see_each_other(exported):
    """SORT C2C isolation: a candidate's score does not depend on the other candidates of its request. With
    either RoPE, shuffling the others around a candidate that keeps its place leaves its score unchanged.
    With time RoPE (all candidates share the request time) it also scores alone as it scores in the list;
    index RoPE gives candidate i the index G + i, so there its place in the list is part of its input (one
    reason CADET uses time) and it scores alone as at place 0."""
    m, scorer = exported
    tokens = _request(m, 7, 300, 25, 2.0)
    together = scorer.score_tokens(tokens)
    for i in (0, 11, 24):
        others = np.random.default_rng(i).permutation([j for j in range(25) if j != i])
        shuffled = scorer.score_tokens(tokens.with_candidates(np.insert(others, i, i)))
        np.testing.assert_allclose(shuffled[i], together[i], atol=1e-6)
        alone = scorer.score_tokens(tokens.with_candidates(slice(i, i + 1)))[0]
        if m.cfg.rope.mode == "time" or i == 0:
            np.testing.assert_allclose(alone, together[i], atol=1e-6)
        else:
            assert np.abs(alone - together[i]).max() > 1e-6   # index RoPE: the place is an input


def test_the_per_bucket_calibration_travels_in_the_graph(tmp_path):
    """The calibration fitted after training (a per-bucket logit shift in the served head) is in the weights,
    so the exported graph serves calibrated probabilities: the same as torch, and shifted by exactly it."""
    m = _student("time")
    tokens = _request(m, 3, 200, 20, 1.0)
    raw = torch_probs(m, tokens)
    shift = torch.tensor([0.7, -0.4])
    m.main_head.calibration.copy_(shift)
    scorer = OnnxScorer(export_onnx(m, tmp_path / "model.onnx"), threads=1)
    got = scorer.score_tokens(tokens)
    np.testing.assert_allclose(got, torch_probs(m, tokens), atol=PARITY_TOLERANCE)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    np.testing.assert_allclose(logit(got) - logit(raw), np.broadcast_to(shift.numpy(), raw.shape), atol=1e-3)


def test_the_latency_of_real_requests_is_measured(exported):
    """The latency gate's input on requests (its empty case, nothing measured, is in tests/test_gates.py)."""
    m, scorer = exported
    p99 = latency_p99_ms(scorer, [_request(m, seed, 50, 5, 2.0) for seed in range(3)], repeats=2)
    assert np.isfinite(p99) and p99 > 0


def test_scoring_flushes_denormals_only_while_the_graph_runs(exported):
    """The scorer flushes denormals to zero for speed (OnnxScorer), but neither building the session nor
    scoring leaves the caller's thread in that mode: its other float maths keep IEEE subnormals."""
    m, scorer = exported
    assert np.float64(5e-324) != 0.0  # the session was built in this thread by the fixture
    scorer.score_tokens(_request(m, 2, 50, 4, 1.0))
    assert np.float64(5e-324) != 0.0


def test_the_last_layer_queries_only_the_candidates(exported):
    """The graph's last layer computes the candidates' rows alone (the history there gives keys and values):
    its output has one row per candidate, and parity with Student.forward holds (tested above)."""
    m, _ = exported
    tokens = _request(m, 4, 120, 9, 1.0)
    a = {k: torch.from_numpy(v) for k, v in request_arrays(tokens).items()}
    rows = []
    hook = m.blocks[-1].register_forward_hook(lambda _mod, _args, out: rows.append(out.shape[0]))
    try:
        with torch.no_grad():
            RequestScorer(m)(**a)
    finally:
        hook.remove()
    assert rows == [9]


def test_every_rmsnorm_is_one_fused_node_in_the_graph(exported):
    """onnxruntime's fusions ran at export: each RMSNorm of the served path is one SimplifiedLayerNormalization
    (per block two and the Q/K norms two, the head one) and no RMSNorm is left as Pow / ReduceMean nodes."""
    import onnx

    m, scorer = exported
    ops = [node.op_type for node in onnx.load(str(scorer.path)).graph.node]
    per_block = 2 + (2 if m.cfg.backbone.qk_norm else 0)
    assert ops.count("SimplifiedLayerNormalization") == per_block * len(m.blocks) + 1
    assert "ReduceMean" not in ops and "Pow" not in ops


def test_a_user_without_history_scores_cold(exported):
    m, scorer = exported
    tokens = _request(m, 5, 0, 12, 0.0)
    assert tokens.n_groups == 0
    np.testing.assert_allclose(scorer.score_tokens(tokens), torch_probs(m, tokens), atol=PARITY_TOLERANCE)


def test_the_bundle_carries_the_config_that_tokenises_requests(tmp_path):
    m = _student("time")
    bundle = write_bundle(m, tmp_path / "serving")
    found = find_bundle(tmp_path)
    assert found.onnx == bundle.onnx and found.student_config() == m.cfg
    with pytest.raises(FileNotFoundError, match="model.onnx"):
        find_bundle(tmp_path / "serving" / "nowhere")


def test_windowed_students_are_refused_clearly():
    _, cfg, _ = preset("tiny")
    m = Student(dataclasses.replace(cfg, mask=dataclasses.replace(cfg.mask, window=64)))
    with pytest.raises(ValueError, match="window"):
        RequestScorer(m)
