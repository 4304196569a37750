"""Model benchmarks (CPU-friendly defaults; ratios measured in the same run, never asserted).

1. Training throughput, student vs teacher, on samples with a --history-event history:
   forward + backward + AdamW step on pre-collated batches (one user-day per batch).
   Reported as events/s (raw events consumed, the fair unit: the teacher sees each impression as
   two tokens, the student sees merged groups) and model tokens/s.
2. Candidate scoring: N candidates of one request in ONE masked pass (candidate isolation) vs one
   pass per candidate, same student, same history; also checks both give the same scores.

    python benchmarks/model_throughput.py                      # defaults: 4K events, N=256
    python benchmarks/model_throughput.py --history-events 2000 --candidates 64 --steps 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import torch  # noqa: E402

from models.config import BackboneConfig, FeatureConfig, StudentConfig, TeacherConfig  # noqa: E402
from models.data import collate, iter_samples, student_tokens, teacher_tokens  # noqa: E402
from models.metrics import effective_lengths  # noqa: E402
from models.student import Student  # noqa: E402
from testkit.synthetic_samples import write_training_samples  # noqa: E402
from models.teacher import Teacher  # noqa: E402


def features():
    return FeatureConfig(item_buckets=1 << 16, campaign_buckets=4096, advertiser_buckets=1024, category_buckets=256,
                         brand_buckets=1024)


def backbone(a):
    return BackboneConfig(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, attn_backend=a.backend, attn_chunk=a.chunk)


def train_rate(model, batches, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step(b):
        out = model(b, serving=False)
        loss = sum(w * s / max(1.0, float(c)) for s, c, w in model.loss_sums(out, b.target_tensors("cpu")).values())
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(batches[0])  # warm-up
    t0 = time.perf_counter()
    ev = tok = 0
    for i in range(steps):
        b = batches[i % len(batches)]
        step(b)
        ev += b.n_events
        tok += b.n_tokens
    dt = time.perf_counter() - t0
    return {"events_per_s": ev / dt, "tokens_per_s": tok / dt, "s_per_step": dt / steps, "tokens_per_batch": tok / steps}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = {"--history-events": 4096, "--users": 2, "--candidates": 256, "--d-model": 64, "--layers": 4, "--heads": 2,
             "--steps": 3}
    for name, default in sizes.items():
        p.add_argument(name, type=int, default=default)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = stable on shared cores)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--per-candidate-limit", type=int, default=0, help="time only this many per-candidate passes and "
                   "extrapolate (0 = all)")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    fc = features()
    res = {"args": vars(a), "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        H = a.history_events
        write_training_samples(os.path.join(tmp, "train"), n_users=a.users, hist_len=(H, H), history_days=365,
                               n_items=2000, max_requests=2, candidates=(4, 8), seed=1)
        samples = list(iter_samples(os.path.join(tmp, "train"), fc))
        tcfg = TeacherConfig(features=fc, backbone=backbone(a), max_len=4 * H)
        scfg = StudentConfig(features=fc, backbone=backbone(a), max_len=H)
        if not a.skip_train:
            tt = [teacher_tokens(s, fc, tcfg.max_len) for s in samples]
            st = [student_tokens(s, fc, H, max_tokens=4 * H) for s in samples]
            teacher, student = Teacher(tcfg), Student(scfg)
            rt = train_rate(teacher, [collate([t]) for t in tt], a.steps)
            rs = train_rate(student, [collate([t]) for t in st], a.steps)
            res["train"] = {"teacher": rt, "student": rs,
                            "student_over_teacher_events_per_s": rs["events_per_s"] / rt["events_per_s"],
                            "teacher_lengths": effective_lengths(tt), "student_lengths": effective_lengths(st),
                            "student_history_per_stage": student.last_lengths}
            print(f"[train] history {H} events, d={a.d_model} L={a.layers}: teacher {rt['events_per_s']:.0f} ev/s "
                  f"({rt['tokens_per_batch']:.0f} tok/batch, {rt['s_per_step']:.2f} s/step) | student {rs['events_per_s']:.0f} ev/s "
                  f"({rs['tokens_per_batch']:.0f} tok/batch, {rs['s_per_step']:.2f} s/step) | ratio "
                  f"{res['train']['student_over_teacher_events_per_s']:.1f}x (target >= 4x)")
            print(f"        effective length teacher {res['train']['teacher_lengths']} student {res['train']['student_lengths']} "
                  f"student per LPTM stage {student.last_lengths}")
        # ---------------------------------------------------------------- candidate scoring
        write_training_samples(os.path.join(tmp, "serve"), n_users=1, hist_len=(H, H), history_days=365, n_items=2000,
                               max_requests=1, candidates=(a.candidates, a.candidates), seed=2)
        s = next(iter(iter_samples(os.path.join(tmp, "serve"), fc)))
        full = student_tokens(s, fc, H, max_tokens=8 * H)
        N = len(full.cand_ts)
        model = Student(scfg).eval()
        with torch.no_grad():
            b = collate([full])
            model(b)
            t0 = time.perf_counter()
            one = model(b)["logits"]
            t_one = time.perf_counter() - t0
            n_each = N if a.per_candidate_limit <= 0 else min(N, a.per_candidate_limit)
            each = []
            t0 = time.perf_counter()
            for i in range(n_each):
                each.append(model(collate([full.with_candidates(slice(i, i + 1))]))["logits"])
            t_each = (time.perf_counter() - t0) * N / n_each
        diff = float((torch.cat(each) - one[:n_each]).abs().max())
        res["scoring"] = {"N": N, "history_groups": full.n_groups, "one_pass_s": t_one, "per_candidate_total_s": t_each,
                          "speedup": t_each / t_one, "max_abs_score_diff": diff, "per_candidate_timed": n_each}
        print(f"[score] N={N} candidates, history {H} events -> {full.n_groups} groups: one masked pass {t_one * 1e3:.1f} ms | "
              f"one pass per candidate {t_each * 1e3:.0f} ms ({n_each} timed) | speedup {t_each / t_one:.0f}x (target >= 20x) | "
              f"max |score diff| {diff:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)


if __name__ == "__main__":
    main()
