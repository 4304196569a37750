"""The simulator's oracle on the tested impressions: its true click probabilities, and the posterior of each
ad's quality given the training days (what a model of those days could know at best)."""
from __future__ import annotations

import json

from benchmarks.quality_suite.worlds import World


def oracle_rows(world: World, labels) -> dict:
    """The simulator's true click probabilities on exactly the evaluated impressions (labels: the
    pipeline's impression_id / label of the evaluation days), plus the runner's own per-day figure
    (serving visibility, every logged impression of the day)."""
    import pandas as pd

    from models.metrics import auc
    from pipelines.runner import _oracle_auc_by_day

    frames = [pd.read_parquet(world.home / "simulator" / "oracle" / f"date={d}" / "oracle.parquet",
                              columns=["impression_id", "p_click", "p_click_serving"]) for d in world.eval_days]
    o = labels.merge(pd.concat(frames), on="impression_id", how="inner")
    per_day = _oracle_auc_by_day(world.home)
    return {"n": len(o), "n_eval": len(labels), "auc_full": auc(o["label"], o["p_click"]),
            "auc_serving": auc(o["label"], o["p_click_serving"]),
            "runner_auc_serving": {d: per_day.get(d) for d in world.eval_days}}


def evidence_oracle(world: World, labels, grid: int = 161) -> dict:
    """AUCs on the evaluated impressions of the oracle with serving visibility when it knows each ad's
    quality only from the training days (``auc_evidence``) and not at all (``auc_no_ad_quality``):
    everything else in the simulator's click logit is kept exact, and each ad's quality is replaced by
    its posterior given the ad's logged training impressions and their clicks (the quality prior
    N(0, strength^2) of the world, on a grid), the prediction averaging the click probability over that
    posterior. No model trained on those days can know more about an ad, so the first is the part of
    the oracle a trained model could reach; the rest of the gap to the oracle is what the training days
    do not show."""
    import numpy as np
    import pandas as pd
    from scipy import sparse
    from scipy.special import expit, logit

    from models.metrics import auc
    from transforms.simulator.world import Catalog, DefectRates, Strengths, WorldConfig

    m = json.loads((world.home / "simulator" / "manifest.json").read_text())
    c = m["config"]
    cfg = WorldConfig(**{**c, "strengths": Strengths(**c["strengths"]), "defects": DefectRates(**c["defects"])})
    cat = Catalog.build(cfg, m["seed"])
    sigma = cfg.strengths.quality

    def rows(days, p_col):
        o = pd.concat([pd.read_parquet(world.home / "simulator" / "oracle" / f"date={d}" / "oracle.parquet",
                                       columns=["impression_id", "ad_id", "surface", "position", p_col, "clicked",
                                                "logged"]) for d in days])
        exam = np.array([cat.examination[s][p - 1] for s, p in zip(o["surface"], o["position"])])
        ad = o["ad_id"].to_numpy()
        # the logit without the ad's quality: the click was drawn from the full-information p_click
        rest = logit(np.clip(o[p_col].to_numpy() / exam, 1e-9, 1 - 1e-9)) - cat.ad_quality[ad]
        return o, exam, ad, rest

    g = np.linspace(-4 * sigma, 4 * sigma, grid)
    o, exam, ad, rest = rows(world.train_days, "p_click")
    keep = o["logged"].to_numpy()
    exam, ad, rest, y = exam[keep], ad[keep], rest[keep], o["clicked"].to_numpy()[keep]
    p = np.clip(exam[:, None] * expit(rest[:, None] + g[None, :]), 1e-12, 1 - 1e-12)
    loglik = np.where(y[:, None], np.log(p), np.log1p(-p))
    per_ad = sparse.csr_matrix((np.ones(len(ad)), (ad, np.arange(len(ad)))), shape=(cfg.n_ads, len(ad))) @ loglik
    log_post = per_ad - g[None, :] ** 2 / (2 * sigma ** 2)
    post = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    post /= post.sum(axis=1, keepdims=True)

    o, exam, ad, rest = rows(world.eval_days, "p_click_serving")
    scored = labels.merge(pd.DataFrame({"impression_id": o["impression_id"].to_numpy(),
                                        "evidence": exam * (expit(rest[:, None] + g[None, :]) * post[ad]).sum(axis=1),
                                        "no_ad_quality": exam * expit(rest)}), on="impression_id")
    return {f"auc_{k}": auc(scored["label"], scored[k]) for k in ("evidence", "no_ad_quality")}
