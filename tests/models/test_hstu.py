"""The quality report's HSTU-style ranker (benchmarks/quality_suite/hstu.py): its chunked pointwise attention
against the dense formula it implements, its masks, and one training run through the pipeline's loop."""
import math

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.quality_suite.hstu import HSTUConfig, HSTURanker, hstu_interval_attention, time_buckets
from mt_util import tiny_teacher
from models.data import PackedLoader, collate
from models.masks import teacher_bounds
from models.teacher import Teacher
from models.train import TrainConfig, fit_with_holdout


def dense_hstu(q, k, v, lo, hi, ts, rab, n):
    """The module doc's formula over the whole (T, T) matrix: the specification."""
    T = q.shape[0]
    j = torch.arange(T)
    attends = ((j[None] >= lo[:, None]) & (j[None] < hi[:, None])) | torch.eye(T, dtype=torch.bool)
    scores = torch.einsum("qhd,khd->hqk", q, k) + rab[time_buckets(ts[:, None] - ts[None, :], rab.shape[0])].permute(2, 0, 1)
    return torch.einsum("hqk,khd->qhd", F.silu(scores) * attends / n, v)


def _packed_bounds(lengths, gen):
    """Causal intervals of packed sequences, each query's upper bound pulled back at random (a delay mask's shape)."""
    lo, hi = [], []
    start = 0
    for n in lengths:
        for i in range(n):
            lo.append(start)
            hi.append(start + int(torch.randint(0, i + 1, (1,), generator=gen)))
        start += n
    return torch.tensor(lo), torch.tensor(hi)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4), chunk=st.sampled_from([1, 7, 128]),
       seed=st.integers(0, 2**16))
def test_chunked_attention_is_the_dense_formula_forward_and_backward(lengths, chunk, seed):
    gen = torch.Generator().manual_seed(seed)
    T, H, D = sum(lengths), 2, 4
    q, k, v = (torch.randn(T, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rab = torch.randn(16, H, generator=gen, dtype=torch.float64, requires_grad=True)
    ts = torch.randint(0, 10**9, (T,), generator=gen).sort().values
    lo, hi = _packed_bounds(lengths, gen)
    got = hstu_interval_attention(q, k, v, lo, hi, ts, rab, n=64.0, chunk=chunk)
    want = dense_hstu(q, k, v, lo, hi, ts, rab, 64.0)
    torch.testing.assert_close(got, want)
    g = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((got * g).sum(), (q, k, v, rab))
    ref = torch.autograd.grad((want * g).sum(), (q, k, v, rab))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b)


def test_time_buckets_are_hstus_log_buckets():
    seconds = torch.tensor([0.0, 0.5, 1.0, math.exp(0.301 * 10.5), -math.exp(0.301 * 3.5), 1e30])
    assert time_buckets(seconds * 1000, 64).tolist() == [0, 0, 0, 10, 3, 63]


def _batch(samples_dir, cfg):
    return collate(next(iter(PackedLoader(samples_dir, "teacher", cfg, 600, seed=None))))


def test_a_scored_token_reads_nothing_its_delay_mask_hides(samples_dir):
    """Changing every token that a scored token may not read (newer than the serving delay, or another user's) leaves
    its logits alone, as in the teacher; changing the tokens it reads moves them."""
    cfg = HSTUConfig.like(tiny_teacher())
    torch.manual_seed(0)
    model = cfg.build().eval()
    batch = _batch(samples_dir, cfg)
    t = batch.tensors
    lo, hi = teacher_bounds(t["offsets"], t["ts"], t["is_target"], cfg.mask.delay_ms)
    q = int(torch.nonzero(t["is_target"] & (hi > lo)).flatten()[-1])
    read = torch.zeros(len(lo), dtype=torch.bool)
    read[lo[q]:hi[q]] = True
    read[q] = True
    with torch.no_grad():
        base = model(batch)["logits"][int(t["is_target"][:q].sum())]
        for changed in (~read, read):
            feats = t["feats"].clone()
            feats[changed] = 0  # every field null
            batch.tensors["feats"] = feats
            logits = model(batch)["logits"][int(t["is_target"][:q].sum())]
            batch.tensors["feats"] = t["feats"]
            assert torch.equal(logits, base) == (changed is not read)


def test_it_trains_through_the_pipelines_loop_and_differs_from_the_teacher_only_in_its_layers(samples_dir):
    cfg = HSTUConfig.like(tiny_teacher())
    torch.manual_seed(0)
    model = cfg.build()
    teacher = Teacher(tiny_teacher()).state_dict()
    assert type(model) is HSTURanker
    assert {k: v.shape for k, v in model.state_dict().items() if not k.startswith("blocks.")} == \
        {k: v.shape for k, v in teacher.items() if not k.startswith("blocks.")}
    res = fit_with_holdout(model, samples_dir, TrainConfig(epochs=2, holdout=0.2, token_budget=600, device="cpu",
                                                               log_every=10**9, ckpt_every=0))
    assert res.step > 0 and all(math.isfinite(r["loss"]) for r in res.history)
    assert res.val_curve and all(0.0 <= a <= 1.0 for a in res.val_curve)
    assert any(float(layer.rab.detach().abs().sum()) > 0 for layer in model.blocks)  # the time bias learnt something
