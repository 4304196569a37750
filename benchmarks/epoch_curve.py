"""Out-of-time AUC after every epoch, for the pipeline's teacher or student (issue #6).

    .venv/bin/python benchmarks/epoch_curve.py --samples /tmp/demo-home/lake/training_samples --kind teacher
    .venv/bin/python benchmarks/epoch_curve.py --samples ... --kind student --no-cross-features --epochs 8

Trains one model from scratch on every day but the last `--test-days` (1 torch thread, seed 0) and,
after each epoch, scores each test day under serving conditions (models.evaluate). Prints one JSON line
per epoch. The models and their training settings are the pipeline's own (assets/training.py:
models/config.py: DEMO_TEACHER_SIZES / DEMO_STUDENT_SIZES through teacher_config / student_config / train_config),
except that the epoch count is the curve's and no step floor or cap applies; `--id-dropout`, `--layers` and
`--no-cross-features` change one thing at a time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.config import (DEMO_STUDENT_SIZES, DEMO_TEACHER_SIZES, student_config, teacher_config,  # noqa: E402
                           train_config)
from models.student import Student  # noqa: E402
from models.teacher import Teacher  # noqa: E402
from models.train import evaluate, fit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, required=True, help="a lake's training_samples folder (date=D partitions)")
    ap.add_argument("--kind", choices=("teacher", "student"), default="teacher")
    ap.add_argument("--layers", type=int, help="default: the pipeline's (4 for the teacher, 2 for the student)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--id-dropout", type=float, help="default: the pipeline's (0.5 for the teacher, 0 for the student)")
    ap.add_argument("--no-cross-features", action="store_true", help="FeatureConfig.cross_windows_days=()")
    ap.add_argument("--test-days", type=int, default=3)
    a = ap.parse_args()
    days = sorted(p for p in a.samples.glob("date=*"))
    if len(days) <= a.test_days:
        raise SystemExit(f"{a.samples} holds {len(days)} days: need more than --test-days {a.test_days}")
    train, test = [str(p) for p in days[:-a.test_days]], days[-a.test_days:]
    teacher = a.kind == "teacher"
    overrides = {k: v for k, v in {"id_dropout": a.id_dropout, ("teacher_layers" if teacher else "student_layers"):
                                   a.layers}.items() if v is not None}
    size = dataclasses.replace(DEMO_TEACHER_SIZES if teacher else DEMO_STUDENT_SIZES, **overrides)
    torch.set_num_threads(1)
    cfg = teacher_config(size) if teacher else student_config(size)
    if a.no_cross_features:
        cfg = dataclasses.replace(cfg, features=dataclasses.replace(cfg.features, cross_windows_days=()))
    torch.manual_seed(size.seed)  # the initialisation models.train_teacher / train_student give
    model = (Teacher if teacher else Student)(cfg)
    with tempfile.TemporaryDirectory() as ckpt:
        for epoch in range(1, a.epochs + 1):
            started = time.perf_counter()
            # one more epoch from the previous epoch's checkpoint: the same run as `epochs` in one go
            tc = dataclasses.replace(train_config(size), epochs=epoch, holdout=0.0, max_steps=None, log_every=10**9,
                                     ckpt_every=0)
            step = fit(model, train, tc, ckpt_dir=ckpt, resume=True).step
            seconds = time.perf_counter() - started
            aucs = {p.name.split("=", 1)[1]: round(evaluate(model, str(p), token_budget=4096)["auc"], 4) for p in test}
            print(json.dumps({"kind": a.kind, "id_dropout": size.id_dropout, "cross_features": not a.no_cross_features,
                              "epoch": epoch, "step": step, "train_s": round(seconds), **aucs}), flush=True)


if __name__ == "__main__":
    main()
