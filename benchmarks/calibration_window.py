"""How many days' held-out slices the daily student's calibration should be fitted on, per world (issue #18
item 6): the pipeline's daily chain (benchmarks/quality_suite/protocol.py, no KD, one training seed) calibrated
on the held-out slices of its newest 1..N days (models.calibrate_on_days, as assets/training.py does
with StudentTrainingConfig.calibration_days), each scored on the next day.

    .venv/bin/python benchmarks/calibration_window.py --home /tmp/gq-demo --world demo
    .venv/bin/python benchmarks/calibration_window.py --home /tmp/gq-history-heavy --world history-heavy

Needs a world quality_report.py has built and a run of its daily variants (for the chain's days); prints the
uncalibrated model's predicted / observed CTR per bucket on each day's held-out slice and on the next day (what
each slice pulls the shift towards), then, per window, the next day's AUC and predicted / observed CTR per
bucket with its standard error clustered by user, and the RMS of log(pred / obs) over the buckets.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.quality_suite.protocol import daily_chain, daily_student  # noqa: E402
from benchmarks.quality_suite.variants import Recipe  # noqa: E402
from benchmarks.quality_suite.worlds import WORLDS, prepare_simulated  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True, help="quality_report.py's --home for the world")
    ap.add_argument("--world", required=True, choices=sorted(WORLDS))
    ap.add_argument("--days", type=int, default=4, help="the longest window")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch

    from models import calibrate_on_days, evaluate, predict
    from models.data import time_holdout
    from models.train import served_head

    torch.set_num_threads(1)
    world = prepare_simulated(Path(a.home) / a.world, a.world, WORLDS[a.world], None, 1)
    recipe = Recipe.served()
    holdout = recipe.student_train.holdout
    _, chain = daily_chain(world, a.seed)
    model, _ = daily_student(world, recipe.student, recipe, a.seed, None, chain)
    # what each slice would pull the shift towards: the uncalibrated model's ratio on it, and on the next day
    served_head(model).calibration.zero_()
    print("| world | uncalibrated on | pred / obs bucket 0 | bucket 1 |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for day in [d for d in world.train_days if d <= chain[-1]][-a.days:] + world.eval_days:
            paths = world.samples([day])
            if day not in world.eval_days:
                paths = time_holdout(paths, holdout, f"{tmp}/{day}")[1]
            p = predict(model, paths, with_labels=True)
            r = p.groupby("position_bucket")["p"].mean() / p.groupby("position_bucket")["label"].mean()
            what = "the next day" if day in world.eval_days else "held-out slice"
            print(f"| {a.world} | {day}, {what} | {r.get(0, float('nan')):.3f} | {r.get(1, float('nan')):.3f} |")
    print()
    print("| world | chain | calibrated on | next-day AUC | pred / obs bucket 0 | bucket 1 | RMS log |\n|---|---|---|---|---|---|---|")
    for n in range(1, a.days + 1):
        days = [d for d in world.train_days if d <= chain[-1]][-n:]
        with tempfile.TemporaryDirectory() as tmp:
            calibrate_on_days(model, world.samples(days), holdout, tmp)
        m = evaluate(model, world.samples(world.eval_days))
        ratios = [m[f"bucket{k}_calibration"] for k in (0, 1)]
        print(f"| {a.world} | {chain[0]}..{chain[-1]} | {days[0]}..{days[-1]} | {m['auc']:.4f} | "
              f"{ratios[0]:.3f} ± {m['bucket0_calibration_se']:.3f} | {ratios[1]:.3f} ± {m['bucket1_calibration_se']:.3f} | "
              f"{np.sqrt(np.mean(np.log(ratios) ** 2)):.3f} |", flush=True)


if __name__ == "__main__":
    main()
