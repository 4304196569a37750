"""Figures and tables attached to registry versions for reviewers."""

from __future__ import annotations

import numpy as np
import pandas as pd


def calibration_figure(pred: pd.DataFrame, title: str, n_bins: int = 10):
    """Reliability curve per position bucket: mean predicted vs observed CTR in quantile bins of p."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = sorted(pred["position_bucket"].unique())
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.2 * len(buckets), 4), squeeze=False)
    for ax, k in zip(axes[0], buckets):
        g = pred[pred["position_bucket"] == k]
        bins = pd.qcut(g["p"].rank(method="first"), q=min(n_bins, len(g)), labels=False)
        curve = g.groupby(bins).agg(predicted=("p", "mean"), observed=("label", "mean"), n=("p", "size"))
        top = float(max(curve["predicted"].max(), curve["observed"].max(), 1e-3)) * 1.1
        ax.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1)
        ax.plot(curve["predicted"], curve["observed"], marker="o")
        ax.set_title(f"bucket {k}: n={len(g):,}, clicks={int(g['label'].sum()):,}")
        ax.set_xlabel("mean predicted CTR")
        ax.set_ylabel("observed CTR")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def metrics_by_bucket(pred: pd.DataFrame) -> dict[str, dict[str, float]]:
    from models.metrics import summarize_predictions

    out = {}
    for k, g in pred.groupby("position_bucket"):
        m = summarize_predictions(g)
        out[f"bucket{int(k)}"] = {key: float(m[key]) for key in ("n", "auc", "gauc", "logloss", "ctr", "mean_p")
                                  if key in m and np.isfinite(m[key])}
    return out
