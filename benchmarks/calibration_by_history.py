"""Where the served student's calibration errs: predicted / observed CTR per position bucket and per user
activity (issue #18 item 6), for every `genrank-ctr` version of a pipeline run.

    .venv/bin/python benchmarks/calibration_by_history.py --home .genrank          # after `make demo`
    .venv/bin/python benchmarks/calibration_by_history.py --home .genrank --heavy 1024
    .venv/bin/python benchmarks/calibration_by_history.py --home .genrank --pooled-days 4

Each version (its tag `partition` is the day it trained on) scores the next day's training samples under
serving conditions (models.predict, the served head with its fitted per-bucket shift). The users are split by
their sample's length on that day: at least `--heavy` events (whose history the student's 1,024-event window
cuts) or fewer. The per-bucket shift fitted on the held-out slice sets the pooled ratio; a ratio that differs
between the two groups is a bias no per-bucket shift can remove. "SE" is the ratio's standard error clustered
by user (models.metrics.ratio_se, what the calibration gate widens its band by).

``--pooled-days N`` asks whether more data would calibrate better: each version's per-bucket shift is refitted
(models.train.calibration_shifts) on the held-out slices (data.time_holdout, the pipeline's holdout share) of
its newest 1..N days pooled, slices the daily student never trains on, and the next day's ratio is printed for
each; the last line is the root-mean-square log ratio over every version and bucket.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deploy.registry import CTR, default_registry  # noqa: E402
from models import load_model, predict  # noqa: E402
from models.config import DEMO_STUDENT_SIZES  # noqa: E402
from models.data import time_holdout  # noqa: E402
from models.metrics import ratio_se  # noqa: E402
from models.train import calibration_shifts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=".genrank", help="a GENRANK_HOME a pipeline run filled")
    ap.add_argument("--heavy", type=int, default=1024, help="events in a user's sample that make it heavy")
    ap.add_argument("--pooled-days", type=int, default=0,
                    help="also refit each version's calibration on its newest 1..N days' held-out slices")
    a = ap.parse_args()
    home = Path(a.home).resolve()
    registry = default_registry(home)
    print("| version | trained on | scored day | bucket | users | impressions | observed CTR | predicted CTR | pred / obs "
          "| SE |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    pooled = []
    with tempfile.TemporaryDirectory() as tmp:
        for mv in sorted(registry.complete_versions(CTR), key=lambda mv: int(mv.version)):
            trained = mv.tags.get("partition")
            if trained is None:
                continue
            day = (dt.date.fromisoformat(trained) + dt.timedelta(days=1)).isoformat()
            samples = home / "lake" / "training_samples" / f"date={day}"
            if not samples.is_dir():
                continue
            model = load_model(registry.checkpoint(CTR, mv.version, Path(tmp) / str(mv.version)))
            p = predict(model, [str(samples)], with_labels=True)
            length = pd.read_parquet(samples, columns=["user_id"])["user_id"].value_counts().rename("events")
            p = p.join(length, on="user_id")
            p["users"] = (p["events"] >= a.heavy).map({True: f">= {a.heavy} events", False: f"< {a.heavy} events"})
            groups = [((b, users), g) for (b, users), g in p.groupby(["position_bucket", "users"])]
            groups += [((b, "all"), g) for b, g in p.groupby("position_bucket")]
            for (bucket, users), g in groups:
                print(f"| v{mv.version} | {trained} | {day} | {bucket} | {users} | {len(g):,} | {g['label'].mean():.4f} | "
                      f"{g['p'].mean():.4f} | {g['p'].mean() / g['label'].mean():.2f} | "
                      f"{ratio_se(g['p'], g['label'], g['user_id']):.3f} |", flush=True)
            if a.pooled_days:
                pooled += refitted(model, mv.version, home, trained, p, a.pooled_days, Path(tmp) / "slices")
    if pooled:
        print("\n| version | shift fitted on | clicks | shift per bucket | next day pred / obs per bucket |")
        print("|---|---|---|---|---|")
        for row in pooled:
            print(f"| v{row['version']} | {row['days']} | {row['clicks']} | {row['shift']} | {row['ratio']} |")
        # compared over the versions that have every pooled length (a first version has fewer older days)
        longest = max(r["n_days"] for r in pooled)
        common = {r["version"] for r in pooled if r["n_days"] == longest}
        for n in range(1, longest + 1):
            logs = np.concatenate([np.log(r["ratios"]) for r in pooled if r["n_days"] == n and r["version"] in common])
            print(f"newest {n} day(s): RMS log(pred / obs) on the next day {np.sqrt(np.mean(logs ** 2)):.3f} "
                  f"over {len(logs)} bucket x version (v{', v'.join(sorted(map(str, common), key=int))})")


def refitted(model, version: str, home: Path, trained: str, next_day: pd.DataFrame, n_days: int, slices: Path) -> list[dict]:
    """The next-day ratios of ``model`` with its shift refitted on the held-out slices of its newest 1..n_days
    days (``next_day``: its predictions there)."""
    head = model.main_head
    shift = head.calibration.numpy().astype(np.float64)
    k = len(shift)
    bucket = np.clip(next_day["position_bucket"].to_numpy(), 0, k - 1)
    raw = next_day["logit"].to_numpy(np.float64) - shift[bucket]
    head.calibration.zero_()
    preds, rows = [], []
    for back in range(n_days):
        day = (dt.date.fromisoformat(trained) - dt.timedelta(days=back)).isoformat()
        folder = home / "lake" / "training_samples" / f"date={day}"
        if not folder.is_dir():
            break
        _, held_out = time_holdout([str(folder)], DEMO_STUDENT_SIZES.holdout, str(slices / day))
        preds.append(predict(model, held_out, with_labels=True))
        fit_on = pd.concat(preds, ignore_index=True)
        refit = calibration_shifts(fit_on, k)
        p = 1.0 / (1.0 + np.exp(-(raw + refit[bucket])))
        ratios = np.array([p[bucket == b].mean() / next_day["label"].to_numpy()[bucket == b].mean()
                           for b in range(k) if (bucket == b).any()])
        rows.append({"version": version, "n_days": back + 1, "days": f"{day}..{trained}",
                     "clicks": int(fit_on["label"].sum()), "shift": np.round(refit, 3).tolist(),
                     "ratio": np.round(ratios, 3).tolist(), "ratios": ratios})
    head.calibration.copy_(torch.as_tensor(shift))
    return rows


if __name__ == "__main__":
    main()
