"""Triton interval attention on a real GPU (skipped without CUDA): fp32 and bf16, forward and
gradients, against the fp32 torch reference, with the bf16-relative tolerance idiom."""
import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cases(dev):
    from models.masks import candidate_bounds, teacher_bounds
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([700, 1500, 333])
    off = torch.nn.functional.pad(lens.cumsum(0), (1, 0))
    ts = torch.cat([torch.sort(torch.randint(0, 10_000, (int(n),), generator=g)).values for n in lens])
    is_t = torch.rand(int(off[-1]), generator=g) < 0.2
    yield "causal", *teacher_bounds(off, ts, torch.zeros_like(is_t), 0)
    yield "delay", *teacher_bounds(off, ts, is_t, 500)
    hl, cl = torch.tensor([1024, 777]), torch.tensor([256, 100])
    hts = torch.randint(0, 5000, (int(hl.sum()),), generator=g)
    cut = torch.randint(0, 6000, (int(cl.sum()),), generator=g)
    yield "candidates", *candidate_bounds(hl, hts, cl, cut)[3:]
    yield "window", *candidate_bounds(hl, hts, cl, cut, window=200, n_global=32)[3:]


@pytest.mark.parametrize("D", [64, 48])
def test_triton_cuda_vs_reference(D):
    from models.kernels import interval_attention, interval_attention_reference
    dev = torch.device("cuda")
    for name, lo, hi in _cases(dev):
        lo, hi = lo.to(dev), hi.to(dev)
        T, H = lo.numel(), 4
        g = torch.Generator(device="cpu").manual_seed(1)
        q, k, v, do = [torch.randn(T, H, D, generator=g).to(dev) for _ in range(4)]

        def run(dtype, backend, **kw):
            qq, kk, vv = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
            if backend == "reference":
                o = interval_attention_reference(qq, kk, vv, lo, hi, **kw)
            else:
                o = interval_attention(qq, kk, vv, lo, hi, backend=backend)
            return [o.float()] + [x.float() for x in torch.autograd.grad(o, (qq, kk, vv), do.to(dtype))]

        ref = run(torch.float32, "reference")
        ref_bf16 = run(torch.bfloat16, "reference", compute_dtype=None)
        k32 = run(torch.float32, "triton")
        k16 = run(torch.bfloat16, "triton")
        for i, what in enumerate(["out", "dq", "dk", "dv"]):
            e16 = float((ref_bf16[i] - ref[i]).abs().max())
            ek16 = float((k16[i] - ref[i]).abs().max())
            ek32 = float((k32[i] - ref[i]).abs().max())
            assert ek32 < 1e-3, (name, what, ek32)
            assert ek16 <= 4 * e16 + 1e-3, (name, what, ek16, e16)


def test_model_trains_on_cuda_with_triton_and_bf16(tmp_path):
    from mt_util import tiny_student
    from models.config import TrainConfig
    from testkit.synthetic_samples import write_training_samples
    from models.train import predict, train_student
    root = str(tmp_path / "ts")
    write_training_samples(root, n_users=24, hist_len=(50, 200), seed=3)
    cfg = tiny_student(backbone=dict(attn_backend="auto", n_layers=4), max_len=256)
    res = train_student(root, None, cfg, TrainConfig(lr=3e-3, token_budget=4096, epochs=100, max_steps=60,
                                                     warmup_steps=5, log_every=1000))
    assert next(res.model.parameters()).is_cuda
    assert res.history[-1]["ctr"] < 0.5 * res.history[0]["ctr"]
    pred = predict(res.model, root)
    assert pred["p"].between(0, 1).all() and len(pred) > 0
