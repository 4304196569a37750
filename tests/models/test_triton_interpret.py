"""Triton interval attention vs the torch reference under TRITON_INTERPRET=1 (CPU, fp32).

Runs in a subprocess: triton decides interpret mode when a kernel is decorated, so the
environment variable must be set before the kernel module is imported; a subprocess keeps
the rest of the suite untouched."""
import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
HERE = os.path.dirname(__file__)
# Triton < 3.8's interpreter turns a loaded scalar used as a loop bound into a 1-element array and
# int() of it fails under numpy >= 2.5 (3.8 squeezes it). The project pins triton==3.8.0.
pytestmark = pytest.mark.skipif(tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8),
                                reason="needs the Triton 3.8 interpreter (pinned in pyproject)")


@pytest.fixture(scope="module")
def errors():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "_triton_check.py")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("JSON")][-1]
    return json.loads(line[4:])


@pytest.mark.parametrize("case", ["causal_ragged", "delay", "candidates", "window_global"])
def test_triton_matches_reference_fwd_bwd(errors, case):
    e = errors[case]
    names = ["out", "dq", "dk", "dv"]
    for n, kern, bf16 in zip(names, e["triton"], e["bf16"]):
        # fp32 on CPU: tight absolute tolerance, and within a small multiple of the bf16 reference's error
        assert kern < 1e-4, (case, n, kern)
        assert kern <= 2.0 * bf16 + 1e-6, (case, n, kern, bf16)
