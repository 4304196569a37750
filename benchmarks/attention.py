"""Interval attention benchmark: ms and achieved TFLOP/s against the FLOP model.

FLOP model: a query attends to |[lo_q, hi_q)| + 1 keys; forward = 4 * H * D FLOPs per
(query, key) pair (QK^T and PV), backward counted as 2.5x forward. For a history of L tokens
(causal) plus N isolated candidates the pair count is ~ L^2/2 + L*N (CADET), versus (L+N)^2 for
a dense mask, which is what the dense-masked SDPA baseline computes.

Backends: reference (chunked torch, the spec), sdpa (torch SDPA with a dense boolean mask),
triton (CUDA only; on CPU only under TRITON_INTERPRET=1, far too slow to time).
Memory: CUDA -> max_memory_allocated delta; CPU -> every (backend, mask) runs in a fresh
subprocess and reports its peak-RSS growth over the inputs (--no-isolate to skip).

    python benchmarks/attention.py                                   # CPU: L=4096 N=512, fwd
    python benchmarks/attention.py --bwd --masks causal,candidates,window
    python benchmarks/attention.py --dtype bf16 --bwd                # on a GPU: triton vs reference vs sdpa
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import torch  # noqa: E402

from models.kernels import interval_attention  # noqa: E402
from models.masks import candidate_bounds  # noqa: E402


def bounds(mask: str, L: int, N: int, window: int, n_global: int):
    hl, cl = torch.tensor([L]), torch.tensor([N])
    ts = torch.arange(L)
    cut = torch.full((N,), L, dtype=torch.long)  # candidates see the whole history
    if mask == "causal":
        cl = torch.tensor([0])
        cut = cut[:0]
    w = window if mask == "window" else None
    _, _, _, lo, hi = candidate_bounds(hl, ts, cl, cut, w, n_global if mask == "window" else 0)
    return lo, hi


def pairs(lo, hi) -> int:
    return int((hi - lo).clamp(min=0).sum()) + lo.numel()


def run_one(backend, mask, a, device, dtype):
    lo, hi = bounds(mask, a.L, a.N, a.window, a.n_global)
    T = lo.numel()
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = [torch.randn(T, a.H, a.D, generator=g).to(device=device, dtype=dtype).requires_grad_(a.bwd) for _ in range(3)]
    lo, hi = lo.to(device), hi.to(device)
    dout = torch.randn(T, a.H, a.D, generator=g).to(device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def call():
        o = interval_attention(q, k, v, lo, hi, backend=backend, chunk=a.chunk)
        if a.bwd:
            torch.autograd.grad(o, (q, k, v), dout)
        return o

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        m0 = torch.cuda.memory_allocated()
    call()
    sync()
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    mem = (torch.cuda.max_memory_allocated() - m0) if device.type == "cuda" else \
        (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) * 1024
    P = pairs(lo.cpu(), hi.cpu())
    flops = 4 * a.H * a.D * P * (3.5 if a.bwd else 1.0)
    return {"backend": backend, "mask": mask, "T": T, "pairs": P, "ms": t * 1e3, "tflops": flops / t / 1e12, "peak_mem_mb": mem / 2**20}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the problem: L history tokens, N candidates, H heads of width D; the local window and the global tokens
    for name, default in {"--L": 4096, "--N": 512, "--H": 4, "--D": 64, "--window": 512, "--n-global": 64}.items():
        p.add_argument(name, type=int, default=default)
    p.add_argument("--masks", default="candidates")
    p.add_argument("--backends", default=None, help="default: reference,sdpa (+triton on CUDA)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--bwd", action="store_true", help="time forward + backward")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default=None)
    p.add_argument("--no-isolate", action="store_true")
    p.add_argument("--single", nargs=2, metavar=("BACKEND", "MASK"), help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    if a.single:
        print("JSON" + json.dumps(run_one(a.single[0], a.single[1], a, device, dtype)))
        return
    backends = a.backends.split(",") if a.backends else (["triton", "reference", "sdpa"] if device.type == "cuda" else ["reference", "sdpa"])
    rows = []
    for mask in a.masks.split(","):
        for be in backends:
            if device.type == "cpu" and not a.no_isolate:
                argv = [sys.executable, __file__, "--single", be, mask] + [x for x in sys.argv[1:] if x != "--json"]
                if "--json" in sys.argv:
                    i = argv.index("--json")
                    del argv[i:i + 2]
                out = subprocess.run(argv, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{be}/{mask} failed: {out.stderr[-500:]}")
                    continue
                r = json.loads([x for x in out.stdout.splitlines() if x.startswith("JSON")][-1][4:])
            else:
                r = run_one(be, mask, a, device, dtype)
            rows.append(r)
            print(f"{mask:>10} {be:>9}  T={r['T']:6d}  pairs={r['pairs']:>11,d}  {r['ms']:9.1f} ms  {r['tflops']:8.4f} TFLOP/s  "
                  f"peak +{r['peak_mem_mb']:8.1f} MB", flush=True)
    L, N = a.L, a.N
    print(f"FLOP model pairs: L^2/2+L*N = {L * L // 2 + L * N:,d}  vs dense (L+N)^2 = {(L + N) ** 2:,d}  "
          f"({'fwd+bwd' if a.bwd else 'fwd'}, {a.dtype}, H={a.H} D={a.D}, {device}, threads={torch.get_num_threads()})")
    by = {(r["mask"], r["backend"]): r for r in rows}
    for mask in a.masks.split(","):
        ref = by.get((mask, "reference"))
        for other in ("sdpa", "triton"):
            o = by.get((mask, other))
            if ref and o:
                print(f"  {mask}: {other} / reference time = {o['ms'] / ref['ms']:.2f}x, "
                      f"memory {o['peak_mem_mb']:.0f} MB vs {ref['peak_mem_mb']:.0f} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
