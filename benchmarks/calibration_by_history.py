"""Where the served student's calibration errs: predicted / observed CTR per position bucket and per user
activity (issue #18 item 6), for every `genrank-ctr` version of a pipeline run.

    .venv/bin/python benchmarks/calibration_by_history.py --home .genrank          # after `make demo`
    .venv/bin/python benchmarks/calibration_by_history.py --home .genrank --heavy 1024

Each version (its tag `partition` is the day it trained on) scores the next day's training samples under
serving conditions (models.predict, the served head with its fitted per-bucket shift). The users are split by
their sample's length on that day: at least `--heavy` events (whose history the student's 1,024-event window
cuts) or fewer. The per-bucket shift fitted on the held-out slice sets the pooled ratio; a ratio that differs
between the two groups is a bias no per-bucket shift can remove.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deploy.registry import CTR, default_registry  # noqa: E402
from models import load_model, predict  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=".genrank", help="a GENRANK_HOME a pipeline run filled")
    ap.add_argument("--heavy", type=int, default=1024, help="events in a user's sample that make it heavy")
    a = ap.parse_args()
    home = Path(a.home).resolve()
    registry = default_registry(home)
    print("| version | trained on | scored day | bucket | users | impressions | observed CTR | predicted CTR | pred / obs |")
    print("|---|---|---|---|---|---|---|---|---|")
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
            for (bucket, users), g in p.groupby(["position_bucket", "users"]):
                print(f"| v{mv.version} | {trained} | {day} | {bucket} | {users} | {len(g):,} | {g['label'].mean():.4f} | "
                      f"{g['p'].mean():.4f} | {g['p'].mean() / g['label'].mean():.2f} |", flush=True)
            for bucket, g in p.groupby("position_bucket"):
                print(f"| v{mv.version} | {trained} | {day} | {bucket} | all | {len(g):,} | {g['label'].mean():.4f} | "
                      f"{g['p'].mean():.4f} | {g['p'].mean() / g['label'].mean():.2f} |", flush=True)


if __name__ == "__main__":
    main()
