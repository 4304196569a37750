"""Student training in N processes: ``torchrun --nproc-per-node N`` over the same ``train_student``.

``train_student_procs(procs, ...)`` is ``train_student`` when ``procs`` is 1. Above 1 it writes the inputs
(teacher probabilities as Parquet, the warm-start weights as safetensors, the configs as JSON) to a
scratch folder, launches ``python -m torch.distributed.run --standalone --nproc-per-node N -m
models.distributed FOLDER`` (DistributedDataParallel, gloo on CPU, NCCL on GPUs: ``models.train.fit``),
and reads back what rank 0 saved. Each rank gets ``token_budget / N``, so the global batches are the ones
one process reads, and ``fit`` normalises every loss by global counts: N ranks take the gradient of one
process on the same batches; only the order of floating-point sums differs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from .config import StudentConfig, TrainConfig, from_dict, to_dict
from .train import TrainResult, load_model, save_model, train_student


def train_student_procs(procs: int, samples_paths: str, teacher_probs: pd.DataFrame | None, config: StudentConfig,
                        train: TrainConfig, init_from=None, ckpt_dir: str | None = None) -> TrainResult:
    if procs <= 1:
        return train_student(samples_paths, teacher_probs, config, train, init_from=init_from, ckpt_dir=ckpt_dir,
                             resume=True)
    with tempfile.TemporaryDirectory(prefix="genrank-ddp-") as work:
        work = Path(work)
        if teacher_probs is not None:
            teacher_probs.to_parquet(work / "teacher_probs.parquet")
        if init_from is not None:
            save_model(init_from, str(work / "init.safetensors"))
        # fit's token budget is per rank: N ranks of budget/N read the global batches one process of budget reads
        per_rank = dataclasses.replace(train, token_budget=train.token_budget // procs)
        (work / "job.json").write_text(json.dumps({
            "samples": samples_paths, "config": to_dict(config), "train": to_dict(per_rank), "ckpt_dir": ckpt_dir,
            "warm_start": init_from is not None, "threads": torch.get_num_threads()}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
               "-m", "models.distributed", str(work)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                              env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
        if done.returncode != 0:
            raise RuntimeError(f"torchrun with {procs} processes failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr)[-4000:]}")
        return TrainResult(model=load_model(str(work / "model.safetensors")),
                           **json.loads((work / "result.json").read_text()))


def _worker(work: Path) -> None:
    """One rank under torchrun; rank 0 writes the trained model and its history."""
    import torch.distributed as dist

    job = json.loads((work / "job.json").read_text())
    torch.set_num_threads(job["threads"])
    probs = work / "teacher_probs.parquet"
    result = train_student(job["samples"], pd.read_parquet(probs) if probs.exists() else None,
                           from_dict(StudentConfig, job["config"]), from_dict(TrainConfig, job["train"]),
                           init_from=str(work / "init.safetensors") if job["warm_start"] else None,
                           ckpt_dir=job["ckpt_dir"], resume=True)
    if dist.get_rank() == 0:
        save_model(result.model, str(work / "model.safetensors"))
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(TrainResult) if f.name != "model"}
        (work / "result.json").write_text(json.dumps(fields))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
