"""How much of the click signal in a world's user histories is reachable, and what a model leaves out (issue #6).

    .venv/bin/python benchmarks/history_probe.py --samples /tmp/demo-home/lake/training_samples
    .venv/bin/python benchmarks/history_probe.py --samples ... --predictions /tmp/demo-home/lake/teacher_logits

A probe, not a model: for every target impression it computes a few hand-made features from what serving
would see (the user's events at least one hour older than the impression, the delay mask), fits a
gradient-boosted tree (scikit-learn) on the first days' targets and reports the out-of-time AUC on the
last `--test-days` days. The features follow the effects the simulator's click model has (transforms/
simulator/world.py), measured the way a sequence model could: the share and count of same-category
organic events, same-category impressions and clicks, the decayed same-brand fav/cart/buy memory
(21-day half-life) and same-brand events; plus surface and position bucket. No per-ad statistic: ad
quality is left to the models. The AUC with every feature is a learnable target for the sequence models
on that world; each feature subset shows where it comes from.

With `--predictions` (Parquet with impression_id and logit, e.g. a teacher_logits partition folder), the
tree is fitted on the first test day with the model's logit as a feature, alone and with each feature
group, and scored on the other test days: a large gain from a group means the model does not extract
that signal from the history.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import roc_auc_score

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
STRONG_ACTIONS = ("fav", "cart", "buy")
GROUPS = {
    "category share": ["beh_cat_share"],
    "category counts": ["n_beh_cat", "n_visible"],
    "category impressions/clicks": ["n_imp_cat", "n_click_cat"],
    "brand memory": ["brand_memory", "n_brand"],
}
BASE = ["surface", "bucket"]
ALL = BASE + [f for g in GROUPS.values() for f in g]


def user_features(g: pd.DataFrame, day: str) -> list[dict]:
    g = g.sort_values(["ts_ms", "event_rank"])
    ts, cat, brand = g["ts_ms"].to_numpy(), g["category_id"].to_numpy(), g["brand_id"].to_numpy()
    is_imp = (g["event_kind"] == "impression").to_numpy()
    label = g["label"].to_numpy()
    organic, clicked = ~is_imp, is_imp & (label == 1)
    strong = organic & g["action"].isin(STRONG_ACTIONS).to_numpy()
    rows = []
    for i in np.flatnonzero(g["is_target"].to_numpy() & is_imp & (label >= 0)):
        visible = ts <= ts[i] - HOUR_MS
        same_cat, same_brand = visible & (cat == cat[i]), visible & (brand == brand[i])
        decay = 0.5 ** ((ts[i] - ts) / (21 * DAY_MS))
        rows.append({
            "day": day, "impression_id": g["impression_id"].iat[i], "label": int(label[i]),
            "surface": g["surface"].iat[i], "bucket": g["position_bucket"].iat[i],
            "n_visible": int(visible.sum()), "n_beh_cat": int((same_cat & organic).sum()),
            "beh_cat_share": (same_cat & organic).sum() / max(1, (visible & organic).sum()),
            "n_imp_cat": int((same_cat & is_imp).sum()), "n_click_cat": int((same_cat & clicked).sum()),
            "brand_memory": float(decay[same_brand & strong].sum()), "n_brand": int((same_brand & (organic | clicked)).sum()),
        })
    return rows


def features(samples: Path) -> pd.DataFrame:
    rows = []
    for part in sorted(samples.glob("date=*")):
        day = part.name.split("=", 1)[1]
        df = pd.read_parquet(part)
        for _, g in df.groupby("user_id", sort=False):
            rows.extend(user_features(g, day))
    out = pd.DataFrame(rows)
    out["surface"] = out["surface"].astype("category").cat.codes
    return out


def fit_auc(train: pd.DataFrame, test: pd.DataFrame, cols: list[str]) -> float:
    tree = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05, max_leaf_nodes=15, random_state=0)
    tree.fit(train[cols], train["label"])
    return float(roc_auc_score(test["label"], tree.predict_proba(test[cols])[:, 1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, required=True, help="a lake's training_samples folder (date=D partitions)")
    ap.add_argument("--test-days", type=int, default=3)
    ap.add_argument("--predictions", type=Path, help="Parquet file or folder with impression_id and logit")
    a = ap.parse_args()
    X = features(a.samples)
    days = sorted(X["day"].unique())
    if len(days) <= a.test_days:
        raise SystemExit(f"{a.samples} holds {len(days)} days: need more than --test-days {a.test_days}")
    test_days = days[-a.test_days:]
    train, test = X[X["day"] < test_days[0]], X[X["day"] >= test_days[0]]
    print(f"probe: train {days[0]}..{days[-a.test_days - 1]} ({len(train)} targets), test {test_days[0]}..{test_days[-1]} ({len(test)})")
    print(f"  all features          AUC {fit_auc(train, test, ALL):.4f}  "
          + "  ".join(f"{d}: {fit_auc(train, test[test['day'] == d], ALL):.4f}" for d in test_days))
    print(f"  surface + bucket      AUC {fit_auc(train, test, BASE):.4f}")
    for name, cols in GROUPS.items():
        print(f"  + {name:<26} AUC {fit_auc(train, test, BASE + cols):.4f}")
    if a.predictions is None:
        return
    pred = pd.read_parquet(a.predictions, columns=["impression_id", "logit"])
    P = test.merge(pred, on="impression_id")
    if P.empty:
        raise SystemExit(f"no prediction in {a.predictions} matches a test impression")
    fit_on, score_on = P[P["day"] == test_days[0]], P[P["day"] > test_days[0]]
    print(f"model: its own AUC on {test_days[1]}..{test_days[-1]}: {roc_auc_score(score_on['label'], score_on['logit']):.4f} "
          f"({len(P)} of {len(test)} test targets have a prediction; trees fitted on {test_days[0]})")
    print(f"  logit alone           AUC {fit_auc(fit_on, score_on, ['logit']):.4f}")
    for name, cols in GROUPS.items():
        print(f"  logit + {name:<20} AUC {fit_auc(fit_on, score_on, ['logit'] + cols):.4f}")
    print(f"  logit + all           AUC {fit_auc(fit_on, score_on, ['logit'] + ALL):.4f}")


if __name__ == "__main__":
    main()
