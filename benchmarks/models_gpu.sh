#!/usr/bin/env bash
# One command for a GPU machine: CUDA kernel/model tests, then the attention benchmarks.
#   bash benchmarks/models_gpu.sh            (logs under $OUT, default /tmp/genrank_gpu)
#   FULL=1 bash benchmarks/models_gpu.sh     (also the tests/models suite, less CPU-only DDP over gloo)
set -o pipefail
OUT=${OUT:-/tmp/genrank_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
# The GPU image has torch, triton, pandas, pyarrow, safetensors, hypothesis and pytest, not the pipeline's stack:
# the models tests stop their conftest search at tests/models (the root conftest builds dbt's manifest) and run from
# the repository root.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYTEST="$PY -m pytest -q -p no:cacheprovider --confcutdir=tests/models"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/gpu.txt"
$PYTEST tests/models/test_triton_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
{ echo "== fwd bf16 L=4096 N=512"; $PY benchmarks/attention.py --dtype bf16 --masks causal,candidates,window --repeats 20
  echo "== fwd+bwd bf16 L=4096 N=512"; $PY benchmarks/attention.py --dtype bf16 --bwd --masks causal,candidates,window --repeats 10
  echo "== fwd bf16 L=16384 N=512"; $PY benchmarks/attention.py --dtype bf16 --L 16384 --N 512 --masks candidates,window --repeats 10
  echo "== fwd+bwd bf16 L=16384 N=512"; $PY benchmarks/attention.py --dtype bf16 --bwd --L 16384 --N 512 --masks candidates --repeats 5
} 2>&1 | tee "$OUT/attention.log"
if [ -n "$FULL" ]; then timeout 240 $PYTEST tests/models --ignore=tests/models/test_ddp.py 2>&1 | tee "$OUT/suite.log"; fi
