#!/usr/bin/env bash
# One command for a GPU machine: CUDA kernel/model tests, then the attention benchmarks.
#   bash benchmarks/models_gpu.sh            (logs under $OUT, default /tmp/genrank_gpu)
#   FULL=1 bash benchmarks/models_gpu.sh     (also the whole tests/models suite)
set -o pipefail
OUT=${OUT:-/tmp/genrank_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/gpu.txt"
$PY -m pytest tests/models/test_triton_cuda.py -q -p no:cacheprovider 2>&1 | tee "$OUT/test_cuda.log"
{ echo "== fwd bf16 L=4096 N=512"; $PY benchmarks/attention.py --dtype bf16 --masks causal,candidates,window --repeats 20
  echo "== fwd+bwd bf16 L=4096 N=512"; $PY benchmarks/attention.py --dtype bf16 --bwd --masks causal,candidates,window --repeats 10
  echo "== fwd bf16 L=16384 N=512"; $PY benchmarks/attention.py --dtype bf16 --L 16384 --N 512 --masks candidates,window --repeats 10
  echo "== fwd+bwd bf16 L=16384 N=512"; $PY benchmarks/attention.py --dtype bf16 --bwd --L 16384 --N 512 --masks candidates --repeats 5
} 2>&1 | tee "$OUT/attention.log"
if [ -n "$FULL" ]; then timeout 240 $PY -m pytest tests/models -q -p no:cacheprovider 2>&1 | tee "$OUT/suite.log"; fi
