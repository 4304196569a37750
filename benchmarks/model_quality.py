"""End-to-end API flow on synthetic samples (the shape of the daily pipeline), CPU-sized:

    teacher = train_teacher(days 1..K-2)                         # weekly job
    probs   = predict(teacher, day K-1)                           # teacher_logits cache
    student = train_student(day K-1, probs, init_from=None)       # daily candidate
    evaluate(teacher / student / student-without-KD, day K)       # out-of-time, serving conditions

    python benchmarks/model_quality.py [--users 300] [--days 4] [--steps 600]   (~10 min on 1 CPU thread)
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import torch  # noqa: E402

from models import (BackboneConfig, FeatureConfig, StudentConfig, TeacherConfig, TrainConfig, evaluate, predict,  # noqa: E402
                    train_student, train_teacher)
from models.data import list_sample_files  # noqa: E402
from testkit.synthetic_samples import write_training_samples  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=300)
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    fc = FeatureConfig(item_buckets=1 << 14, campaign_buckets=1024, advertiser_buckets=256, category_buckets=64,
                       brand_buckets=256)
    bb = BackboneConfig(d_model=32, n_layers=2, n_heads=2)
    tc = TrainConfig(lr=3e-3, weight_decay=a.weight_decay, token_budget=4096, epochs=1000, max_steps=a.steps, log_every=100,
                     warmup_steps=10, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        write_training_samples(tmp, n_days=a.days, n_users=a.users, hist_len=(30, 150), noise=a.noise, max_requests=3,
                               candidates=(3, 8), seed=11)
        files = list_sample_files(tmp)
        train_days, distill_day, eval_day = files[:-2], files[-2], files[-1]
        teacher = train_teacher(train_days, TeacherConfig(features=fc, backbone=bb, max_len=512), tc).model
        probs = predict(teacher, distill_day)[["impression_id", "p"]]
        scfg = StudentConfig(features=fc, backbone=BackboneConfig(d_model=32, n_layers=4, n_heads=2), max_len=128)
        student_kd = train_student(train_days + [distill_day], probs, scfg, tc).model
        student_plain = train_student(train_days + [distill_day], None, scfg, tc).model
        res = {name: evaluate(m, eval_day) for name, m in
               (("teacher", teacher), ("student_kd", student_kd), ("student_no_kd", student_plain))}
    keys = ["n", "auc", "gauc", "logloss", "bucket0_calibration", "bucket1_calibration", "len_before_avg", "len_after_avg"]
    for name, m in res.items():
        print(f"{name:>14}: " + "  ".join(f"{k} {m.get(k, float('nan')):.4f}" for k in keys))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)


if __name__ == "__main__":
    main()
