"""What the models' counters are worth, and what the student's history window costs them (issue #18).

    .venv/bin/python benchmarks/counter_probe.py                      # quality_report.py's three simulated worlds
    .venv/bin/python benchmarks/counter_probe.py --worlds demo --seeds 3

A probe, not a model. For every target impression of a quality_report.py world (built there, under
the same --home) it takes the 48 cross features the models are given (MTGR's counters, models.data.cross_counts under
the serving delay) counted three ways: over the user's whole sample, over the newest counter_len events (what
both models count since ModelSizes.counter_events, and the online store keeps), and over the student's history
window only (its newest max_len events, what the student and serving counted before counter_len).
A small MLP (two SiLU layers of 64, AdamW, early stopping on a seeded 15 % of the training rows) on each,
with the position bucket and hour, is fitted on the training days and scored on the test day, per seed.
The AUC on the whole sample's counters is what the counters alone allow a neural model; the differences
are what a shorter log costs before any sequence modelling.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.quality_suite import baselines  # noqa: E402
from benchmarks.quality_suite.variants import Recipe  # noqa: E402
from benchmarks.quality_suite.worlds import WORLDS, prepare_simulated  # noqa: E402
from models.data.batches import tokenizer_for  # noqa: E402
from models.data.samples import iter_samples  # noqa: E402


def counter_rows(world, tcfg, scfg) -> pd.DataFrame:
    """The tree baselines' counter rows (the whole sample's counters as cross0..) with, for the same impressions, the
    student's counters over its counter_len events (log0..) and over its history window alone (window0..)."""
    frames = {prefix: [] for prefix in ("log", "window")}
    tokenizers = {"log": tokenizer_for("student", scfg),
                  "window": tokenizer_for("student", dataclasses.replace(scfg, counter_len=None))}
    for day in world.train_days + world.eval_days:
        for s in iter_samples(world.samples([day]), scfg.features):
            for prefix, tok in tokenizers.items():
                t = tok(s, 1 << 40)
                frames[prefix].append(pd.DataFrame(t.cand_cross, columns=[f"{prefix}{i}" for i in range(t.cand_cross.shape[1])])
                                      .assign(impression_id=t.targets.impression_id))
    rows = baselines.counter_rows(world, tcfg)
    for f in frames.values():
        rows = rows.merge(pd.concat(f, ignore_index=True), on="impression_id", how="inner", validate="one_to_one")
    return rows


def mlp_auc(train: pd.DataFrame, test: pd.DataFrame, cols: list[str], seed: int) -> float:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)

    def design(df):
        onehot = [np.eye(n, dtype=np.float32)[df[c].to_numpy().astype(np.int64) % n] for c, n in (("bucket", 8), ("hour", 24))]
        return torch.from_numpy(np.concatenate([df[cols].to_numpy(np.float32)] + onehot, 1))

    x, xt, y = design(train), design(test), torch.from_numpy(train["label"].to_numpy(np.float32))
    idx = rng.permutation(len(x))
    val, fit = idx[:int(0.15 * len(x))], idx[int(0.15 * len(x)):]
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.SiLU(), torch.nn.Linear(64, 64), torch.nn.SiLU(),
                              torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    best, state, worse = -1.0, None, 0
    while worse < 2:  # stop after two passes without a better validation AUC, keep the best
        for b in torch.from_numpy(rng.permutation(fit)).split(512):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(net(x[b]).squeeze(1), y[b]).backward()
            opt.step()
        with torch.no_grad():
            a = roc_auc_score(y[val].numpy(), net(x[val]).squeeze(1).numpy())
        best, state, worse = (a, {k: v.clone() for k, v in net.state_dict().items()}, 0) if a > best \
            else (best, state, worse + 1)
    net.load_state_dict(state)
    with torch.no_grad():
        return float(roc_auc_score(test["label"], net(xt).squeeze(1).numpy()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default=",".join(WORLDS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--home", default="/tmp/genrank-quality",
                    help="quality_report.py's --home (the worlds are built there)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    recipe = Recipe.served()
    tcfg, scfg = recipe.teacher, recipe.student
    print(f"| world | targets | test targets whose counters the log / the window changes | MLP, whole sample's counters "
          f"| MLP, the newest {scfg.counter_len:,} events | MLP, the student's window ({scfg.max_len:,} events) "
          f"| log - whole (paired) | window - whole (paired) |\n|---|---|---|---|---|---|---|---|")
    for name in a.worlds.split(","):
        world = prepare_simulated(Path(a.home) / name, name, WORLDS[name], None, 1)
        rows = counter_rows(world, tcfg, scfg)
        train, test = rows[rows["day"].isin(world.train_days)], rows[rows["day"].isin(world.eval_days)]
        cols = {p: [c for c in rows.columns if c.startswith(p)] for p in ("cross", "log", "window")}
        changed = [float((np.abs(test[cols["cross"]].to_numpy() - test[cols[p]].to_numpy()).max(1) > 0).mean())
                   for p in ("log", "window")]
        auc = {p: np.array([mlp_auc(train, test, c, s) for s in range(a.seeds)]) for p, c in cols.items()}
        cells = [f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0:.4f}" for v in auc.values()]
        for p in ("log", "window"):
            d = auc[p] - auc["cross"]
            se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
            cells.append(f"{d.mean():+.4f} ± {se:.4f}")
        print(f"| {name} | {len(test):,} test / {len(train):,} train | {changed[0]:.1%} / {changed[1]:.1%} | "
              + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
