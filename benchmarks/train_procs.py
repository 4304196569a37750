"""The student trained by one process vs by `torchrun --nproc-per-node N` (models/distributed.py) on one day of a
pipeline's home: steps, final loss, seconds, and the largest weight and prediction differences.

Usage: python benchmarks/train_procs.py --home HOME --day YYYY-MM-DD [--procs 2] [--id-dropout 0.5]
(the day needs training samples and cached teacher logits: a day after the first teacher)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import dataclasses

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import predict  # noqa: E402
from models.config import DEMO_SIZES, student_config, train_config  # noqa: E402
from models.distributed import train_student_procs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", required=True)
    parser.add_argument("--day", required=True)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--id-dropout", type=float, default=DEMO_SIZES.id_dropout)
    args = parser.parse_args()
    samples = f"{args.home}/lake/training_samples/date={args.day}"
    logits = pd.read_parquet(f"{args.home}/lake/teacher_logits/date={args.day}")[["impression_id", "p"]]
    size = dataclasses.replace(DEMO_SIZES, id_dropout=args.id_dropout)
    torch.set_num_threads(1)  # as the pipeline (GENRANK_TORCH_THREADS)
    results = {}
    for procs in (1, args.procs):
        started = time.perf_counter()
        result = train_student_procs(procs, samples, logits, student_config(size), train_config(size))
        results[procs] = (result, predict(result.model, samples)["p"].to_numpy())
        print(f"{procs} process(es): {result.step} steps, final loss {result.history[-1]['loss']:.6f}, "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    (one, p_one), (many, p_many) = results[1], results[args.procs]
    dw = max(float((a - b).abs().max()) for a, b in zip(one.model.state_dict().values(), many.model.state_dict().values()))
    dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(one.history, many.history))
    print(f"id dropout {args.id_dropout}: max |weight difference| {dw:.2g}, max |p difference| "
          f"{np.abs(p_one - p_many).max():.2g}, max |loss difference| per step {dl:.2g}")


if __name__ == "__main__":
    main()
