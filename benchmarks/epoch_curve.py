"""Out-of-time AUC after every epoch, for the pipeline's teacher or student sizes (issue #6).

    .venv/bin/python benchmarks/epoch_curve.py --samples /tmp/demo-home/lake/training_samples --kind teacher
    .venv/bin/python benchmarks/epoch_curve.py --samples ... --kind teacher --id-dropout 0.5 --epochs 10

Trains one model from scratch on every day but the last `--test-days` (1 torch thread, seed 0) and,
after each epoch, scores each test day under serving conditions (models.evaluate). Prints one JSON line
per epoch. The sizes default to the pipeline's (assets/training.py ModelSizeConfig and
TeacherTrainingConfig): d=64, 2 heads, 4 teacher / 2 student layers, 1,024 tokens, lr 3e-3.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import BackboneConfig, FeatureConfig, StudentConfig, TeacherConfig, TrainConfig  # noqa: E402
from models.student import Student  # noqa: E402
from models.teacher import Teacher  # noqa: E402
from models.train import evaluate, fit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, required=True, help="a lake's training_samples folder (date=D partitions)")
    ap.add_argument("--kind", choices=("teacher", "student"), default="teacher")
    ap.add_argument("--layers", type=int, help="default: 4 for the teacher, 2 for the student")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--id-dropout", type=float, default=0.0)
    ap.add_argument("--test-days", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    days = sorted(p for p in a.samples.glob("date=*"))
    if len(days) <= a.test_days:
        raise SystemExit(f"{a.samples} holds {len(days)} days: need more than --test-days {a.test_days}")
    train, test = [str(p) for p in days[:-a.test_days]], days[-a.test_days:]
    fc = FeatureConfig(item_buckets=1 << 15, campaign_buckets=1 << 12, advertiser_buckets=1 << 11,
                       category_buckets=1 << 10, brand_buckets=1 << 12)
    teacher = a.kind == "teacher"
    bb = BackboneConfig(d_model=64, n_layers=a.layers or (4 if teacher else 2), n_heads=2, id_dropout=a.id_dropout)
    torch.manual_seed(0)
    model = Teacher(TeacherConfig(features=fc, max_len=1024, backbone=bb)) if teacher else \
        Student(StudentConfig(features=fc, max_len=1024, backbone=bb))
    with tempfile.TemporaryDirectory() as ckpt:
        for epoch in range(1, a.epochs + 1):
            started = time.perf_counter()
            # one more epoch from the previous epoch's checkpoint: the same run as `epochs` in one go
            tc = TrainConfig(lr=3e-3, epochs=epoch, token_budget=4096 if teacher else 2048, seed=0, warmup_steps=5,
                             log_every=10**9, ckpt_every=0)
            step = fit(model, train, tc, ckpt_dir=ckpt, resume=True).step
            seconds = time.perf_counter() - started
            aucs = {p.name.split("=", 1)[1]: round(evaluate(model, str(p), token_budget=4096)["auc"], 4) for p in test}
            print(json.dumps({"kind": a.kind, "id_dropout": a.id_dropout, "epoch": epoch, "step": step,
                              "train_s": round(seconds), **aucs}), flush=True)


if __name__ == "__main__":
    main()
