"""What the sequence worlds' effects are worth, and how much of each a model leaves (issue #33).

    .venv/bin/python benchmarks/effect_headroom.py --world sequence --home /tmp/gq-seq
    .venv/bin/python benchmarks/effect_headroom.py --world sequence --home /tmp/gq-seq --models student,student_learned_counts

A quality-report world (benchmarks/quality_suite/worlds.py, built into ``--home`` as quality_report.py builds it,
reused if there) and the simulator's own terms of the click logit for every impression: each user is simulated
again with the world's configuration (transforms.simulator.users.simulate_user; the same seed gives the same
stream), and UserStream.effects holds each term as the click model added it (full information: the last hour's
events count too, which serving does not see).

1. Worth: the report's trees on the user's counters, the ad's CTR and the context (baselines.counters_gbdt, the
   peer of issue #34), tested on the world's test day, alone and with the true term of each effect that is on
   as one more input. The gain is what a model could add over the counters by learning that effect from the log.
2. Left: each ``--models`` row (a quality-report student variant, trained as the report trains it, seed
   ``--seed``) scores the test day; trees on its logit alone and on its logit plus one true term are
   cross-validated over the test day's users (4 folds). What a term still adds to a model's logit is what the
   model did not learn of it; set against the same gain over the counters' trees, it says how much it did.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.quality_suite.baselines import counters_gbdt  # noqa: E402
from benchmarks.quality_suite.protocol import fit_model  # noqa: E402
from benchmarks.quality_suite.variants import Recipe, student_variant  # noqa: E402
from benchmarks.quality_suite.worlds import SEQUENCE_WORLDS, WORLDS, prepare_simulated  # noqa: E402

SEQUENCE_EFFECTS = ("complement", "abandonment")


def effect_terms(spec: dict) -> pd.DataFrame:
    """impression_id and the true term of each sequence effect that the world turns on."""
    from pipelines.cli import world_config
    from transforms.simulator.users import EFFECTS, simulate_user
    from transforms.simulator.world import Catalog

    cfg = world_config(spec["preset"], spec.get("strengths"), spec.get("users"), spec.get("days"),
                       spec.get("bias_logit"))
    on = [e for e in SEQUENCE_EFFECTS if getattr(cfg.strengths, e)]
    catalog, ids, rows = Catalog.build(cfg, spec["seed"]), [], []
    for user in range(1, cfg.n_users + 1):
        stream = simulate_user(cfg, catalog, spec["seed"], user)
        if stream.oracle:
            ids += [o[0] for o in stream.oracle]
            rows.append(np.concatenate(stream.effects))
    effects = np.concatenate(rows)
    # a row of UserStream.effects: examination, the full logit, then one column per EFFECTS term
    return pd.DataFrame({"impression_id": ids, **{e: effects[:, 2 + EFFECTS.index(e)] for e in on}})


def stacked_auc(frame: pd.DataFrame, cols: list[str], seed: int) -> float:
    """Out-of-fold AUC of small trees on ``cols``, 4 folds by user."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.model_selection import GroupKFold

    from models.metrics import auc

    out = np.zeros(len(frame))
    x, y = frame[cols].to_numpy(np.float64), frame["label"].to_numpy()
    for fit_rows, test_rows in GroupKFold(4).split(x, groups=frame["user_id"]):
        trees = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_depth=3, random_state=seed)
        out[test_rows] = trees.fit(x[fit_rows], y[fit_rows]).predict_proba(x[test_rows])[:, 1]
    return auc(y, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", default="sequence", choices=sorted(SEQUENCE_WORLDS))
    ap.add_argument("--home", type=Path, required=True, help="the quality report's --home (the world is <home>/<world>)")
    ap.add_argument("--models", default="", help="quality-report student variants, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    from models import predict
    from models.metrics import auc

    torch.set_num_threads(a.threads)
    spec = {**WORLDS, **SEQUENCE_WORLDS}[a.world]
    world = prepare_simulated(a.home / a.world, a.world, spec, None, 1)
    recipe = Recipe.served()
    terms = effect_terms(spec)
    on = [c for c in terms.columns if c != "impression_id"]
    print(f"{world.name}: test {', '.join(world.eval_days)}; true terms of {', '.join(on)} "
          f"({len(terms):,} impressions)", flush=True)
    base = counters_gbdt(world, recipe.teacher, a.seed)["auc"]
    print(f"  trees on the counters, the ad's CTR and the context: {base:.4f}", flush=True)
    worth = {}
    for effect in on + ["both"]:
        cols = on if effect == "both" else [effect]
        worth[effect] = counters_gbdt(world, recipe.teacher, a.seed, extra=terms[["impression_id", *cols]])["auc"] - base
        print(f"    + the true term of {effect}: {base + worth[effect]:.4f} ({worth[effect]:+.4f})", flush=True)
    for name in filter(None, a.models.split(",")):
        model, _ = fit_model("student", student_variant(recipe.student, name), None, world.train_days, world, recipe,
                             a.seed)
        pred = predict(model, world.samples(world.eval_days), with_labels=True).merge(terms, on="impression_id")
        alone = stacked_auc(pred, ["logit"], a.seed)
        print(f"  {name}: test AUC {auc(pred['label'], pred['p']):.4f}, its logit through the folds' trees {alone:.4f}",
              flush=True)
        for effect in on + ["both"]:
            left = stacked_auc(pred, ["logit", *(on if effect == "both" else [effect])], a.seed) - alone
            print(f"    + the true term of {effect}: {left:+.4f} left of {worth[effect]:+.4f} over the counters' trees "
                  f"(learnt: {1 - left / worth[effect]:.0%})", flush=True)


if __name__ == "__main__":
    main()
