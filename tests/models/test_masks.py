"""Property tests of the single interval contract (hypothesis)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import ATTENTION_BACKENDS
from models.kernels import dense_mask, interval_attention, interval_attention_reference, naive_interval_attention
from models.masks import candidate_bounds, segment_cummax, teacher_bounds

SET = settings(max_examples=40, deadline=None)


@st.composite
def packed_sequences(draw, max_seqs=4, max_len=24):
    lens = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_seqs))
    ts, tgt = [], []
    for n in lens:
        t = sorted(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))
        ts += t
        tgt += draw(st.lists(st.booleans(), min_size=n, max_size=n))
    off = torch.tensor(np.r_[0, np.cumsum(lens)], dtype=torch.long)
    return off, torch.tensor(ts, dtype=torch.long), torch.tensor(tgt, dtype=torch.bool)


def _seq_of(off):
    return torch.repeat_interleave(torch.arange(len(off) - 1), off[1:] - off[:-1])


@SET
@given(packed_sequences(), st.integers(0, 15), st.one_of(st.none(), st.integers(1, 6)), st.integers(0, 3))
def test_target_rows_never_see_tokens_newer_than_delay(data, delay, window, n_global):
    off, ts, tgt = data
    lo, hi = teacher_bounds(off, ts, tgt, delay, window, n_global)
    allowed = dense_mask(lo, hi)
    seq = _seq_of(off)
    T = ts.numel()
    for q in range(T):
        keys = torch.nonzero(allowed[q]).flatten()
        keys = keys[keys != q]
        assert bool((seq[keys] == seq[q]).all()), "crossed a sequence boundary"
        assert bool((keys < q).all()), "saw the future"
        if tgt[q]:
            assert bool((ts[keys] <= ts[q] - delay).all()), "target saw an event inside the delay window"
            # and it sees every such earlier token of its sequence (the mask is not over-restrictive)
            same = torch.nonzero((seq == seq[q]) & (torch.arange(T) < q) & (ts <= ts[q] - delay)).flatten()
            assert set(same.tolist()) == set(keys.tolist())
        elif window is not None:
            # a history row sees the last `window` tokens of its sequence; the newest n_global history rows
            # (the global ones) see all of it
            history = torch.nonzero((seq == seq[q]) & ~tgt).flatten().tolist()
            is_global = n_global > 0 and q in history[-n_global:]
            first = int(off[seq[q]]) if is_global else max(int(off[seq[q]]), q - window)
            assert set(keys.tolist()) == set(range(first, q)), ("global" if is_global else "windowed", q)


@st.composite
def candidate_samples(draw):
    B = draw(st.integers(1, 3))
    hl = draw(st.lists(st.integers(0, 12), min_size=B, max_size=B))
    cl = draw(st.lists(st.integers(1, 6), min_size=B, max_size=B))
    hts = draw(st.lists(st.integers(0, 50), min_size=sum(hl), max_size=sum(hl)))  # merged groups: not monotone
    cut = draw(st.lists(st.integers(-5, 60), min_size=sum(cl), max_size=sum(cl)))
    return (torch.tensor(hl), torch.tensor(hts, dtype=torch.long), torch.tensor(cl), torch.tensor(cut, dtype=torch.long))


@SET
@given(candidate_samples(), st.one_of(st.none(), st.integers(1, 5)), st.integers(0, 2))
def test_candidates_isolated_and_see_only_history_visible_at_request(data, window, n_global):
    hl, hts, cl, cut = data
    off, hpos, cpos, lo, hi = candidate_bounds(hl, hts, cl, cut, window, n_global)
    allowed = dense_mask(lo, hi)
    T = int(off[-1])
    is_cand = torch.zeros(T, dtype=torch.bool)
    is_cand[cpos] = True
    tok_ts = torch.empty(T, dtype=torch.long)
    tok_ts[hpos] = hts
    seq = _seq_of(off)
    hseq = _seq_of(torch.tensor(np.r_[0, np.cumsum(hl.numpy())]))
    rm = torch.empty(T, dtype=torch.long)
    rm[hpos] = segment_cummax(hts, hseq) if hts.numel() else hts
    for i, q in enumerate(cpos.tolist()):
        keys = torch.nonzero(allowed[q]).flatten()
        keys = keys[keys != q]
        assert not bool(is_cand[keys].any()), "a candidate saw another candidate"
        assert bool((seq[keys] == seq[q]).all()), "a candidate saw another request's sample"
        # every visible history token, and every token before it, is no newer than the request cutoff
        assert bool((rm[keys] <= cut[i]).all()), "a candidate saw history newer than its request time"
        # maximal: the next history token would be too new
        n_vis = keys.numel()
        s = int(seq[q])
        if n_vis < int(hl[s]):
            nxt = int(off[s]) + n_vis
            assert int(rm[nxt]) > int(cut[i])
    for q in hpos.tolist():  # history rows: causal within their sample, never see candidates
        keys = torch.nonzero(allowed[q]).flatten()
        assert not bool(is_cand[keys].any())
        assert bool((keys <= q).all())


@st.composite
def random_bounds(draw):
    T = draw(st.integers(1, 40))
    lo, hi = [], []
    for q in range(T):
        a = draw(st.integers(0, T))
        b = draw(st.integers(0, T))
        lo.append(min(a, b))
        hi.append(max(a, b))
    return torch.tensor(lo), torch.tensor(hi)


@SET
@given(random_bounds(), st.integers(1, 3), st.sampled_from([4, 8]), st.sampled_from([1, 5, 64]), st.integers(0, 10_000))
def test_reference_equals_dense_mask_softmax(bounds, H, D, chunk, seed):
    lo, hi = bounds
    T = lo.numel()
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(T, H, D, generator=g, dtype=torch.float64).float().requires_grad_(True) for _ in range(3)]
    out = interval_attention_reference(q, k, v, lo, hi, chunk=chunk)
    ref = naive_interval_attention(q, k, v, lo, hi)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    dout = torch.randn(T, H, D, generator=g)
    g1 = torch.autograd.grad(out, (q, k, v), dout)
    g2 = torch.autograd.grad(ref, (q, k, v), dout)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def _causal_problem(T: int, H: int, D: int, seed: int):
    """Random q, k, v of T tokens and the causal intervals (every token sees itself and all before it)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(T, H, D, generator=g) for _ in range(3)]
    return q, k, v, torch.zeros(T, dtype=torch.long), torch.arange(T)


def test_reference_bf16_compute_is_close_but_not_exact():
    T = 50
    q, k, v, lo, hi = _causal_problem(T, 2, 16, seed=0)
    ref = interval_attention_reference(q, k, v, lo, hi)
    b16 = interval_attention_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), lo, hi, compute_dtype=None).float()
    err = (b16 - ref).abs().max()
    assert 1e-5 < err < 5e-2


def test_dense_mask_detects_a_wrong_mask():
    """The oracle can fail: a reference run with hi shifted by one differs from the true contract."""
    T = 12
    q, k, v, lo, hi = _causal_problem(T, 1, 4, seed=1)
    good = naive_interval_attention(q, k, v, lo, hi)
    bad = interval_attention_reference(q, k, v, lo, torch.clamp(hi + 2, max=T))  # leaks token q+1
    assert not torch.allclose(good, bad, atol=1e-3)


def test_an_unknown_backend_is_refused_naming_the_known_ones(monkeypatch):
    """The dispatch takes only contracts.ATTENTION_BACKENDS, from the argument or GENRANK_ATTN_BACKEND."""
    q = torch.randn(3, 1, 4)
    lo, hi = torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="unknown attention backend 'flash': one of auto, reference") as refused:
        interval_attention(q, q, q, lo, hi, backend="flash")
    assert all(name in str(refused.value) for name in ATTENTION_BACKENDS)
    monkeypatch.setenv("GENRANK_ATTN_BACKEND", "cudnn")
    with pytest.raises(ValueError, match="unknown attention backend 'cudnn'"):
        interval_attention(q, q, q, lo, hi)
    monkeypatch.delenv("GENRANK_ATTN_BACKEND")
    assert torch.allclose(interval_attention(q, q, q, lo, hi), naive_interval_attention(q, q, q, lo, hi))
