"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): Triton kernel vs torch reference,
forward and gradients, on ragged causal, delay, candidate and sliding-window bounds. Prints JSON."""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import torch  # noqa: E402

torch.set_num_threads(1)
from models.kernels import interval_attention  # noqa: E402
from models.masks import candidate_bounds, teacher_bounds  # noqa: E402


def cases():
    g = torch.Generator().manual_seed(0)
    # ragged causal (three sequences, lengths not multiples of the block)
    off = torch.tensor([0, 7, 30, 53])
    ts = torch.sort(torch.randint(0, 100, (53,), generator=g)).values
    yield "causal_ragged", *teacher_bounds(off, ts, torch.zeros(53, dtype=torch.bool), 0)
    # delay windows on target rows
    ts = torch.cat([torch.sort(torch.randint(0, 50, (n,), generator=g)).values for n in (20, 25)])
    off = torch.tensor([0, 20, 45])
    is_t = torch.rand(45, generator=g) < 0.4
    yield "delay", *teacher_bounds(off, ts, is_t, 7)
    # candidates: history + isolated candidates with per-request cutoffs
    hl, cl = torch.tensor([19, 11]), torch.tensor([9, 6])
    hts = torch.randint(0, 60, (30,), generator=g)
    cut = torch.randint(0, 70, (15,), generator=g)
    _, _, _, lo, hi = candidate_bounds(hl, hts, cl, cut)
    yield "candidates", lo, hi
    # sliding window + global tokens with candidates
    _, _, _, lo, hi = candidate_bounds(hl, hts, cl, cut, window=5, n_global=3)
    yield "window_global", lo, hi


def run(T, H, D, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(T, H, D, generator=g) for _ in range(3)]
    dout = torch.randn(T, H, D, generator=g)
    res = {}
    for name, kw, dtype in (("ref", dict(backend="reference"), torch.float32), ("bf16", dict(backend="reference"), torch.bfloat16),
                            ("triton", dict(backend="triton"), torch.float32)):
        qq, kk, vv = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
        if name == "bf16":
            from models.kernels import interval_attention_reference
            o = interval_attention_reference(qq, kk, vv, lo, hi, compute_dtype=None)
        else:
            o = interval_attention(qq, kk, vv, lo, hi, **kw)
        grads = torch.autograd.grad(o, (qq, kk, vv), dout.to(dtype))
        res[name] = [o.float()] + [x.float() for x in grads]
    err = {n: [float((a - b).abs().max()) for a, b in zip(res[n], res["ref"])] for n in ("bf16", "triton")}
    return err


out = {}
for i, (name, lo, hi) in enumerate(cases()):
    T = lo.numel()
    out[name] = run(T, 2, 8 if i % 2 == 0 else 16, lo, hi, i)
print("JSON" + json.dumps(out))
