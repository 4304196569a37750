"""Baselines without a sequence model: the per-bucket historical CTR, what the training days say about each
tested ad, and gradient-boosted trees on the models' counters (GBDT)."""
from __future__ import annotations

import json

from benchmarks.quality_suite.protocol import summary_metrics
from benchmarks.quality_suite.worlds import World


def baseline_metrics(world: World) -> dict:
    import pandas as pd

    from models.metrics import summarize_predictions
    from transforms.sequences import bucket_ctr_baseline

    pred = pd.concat([bucket_ctr_baseline(world.home, d) for d in world.eval_days], ignore_index=True)
    return summarize_predictions(pred)


def ad_evidence(world: World, prior_weight: float = 20.0) -> dict:
    """How much the training days say about each tested ad: the share of tested impressions whose ad had
    impressions in the training days, the median ad's training impressions, and the AUC on the test days of
    the ad's training CTR alone (shrunk to the window's CTR with ``prior_weight`` pseudo-impressions). A
    world whose clicks hang on ad quality (item-heavy) but shows each ad a few times leaves a gap to the
    oracle, which knows every ad's quality exactly, that no model of those days can close."""
    import pandas as pd

    from models.metrics import auc

    def targets(days):
        cols = ["item_id", "label", "is_target", "event_kind"]
        t = pd.concat([pd.read_parquet(p, columns=cols) for p in world.samples(days)])
        return t[t["is_target"] & (t["event_kind"] == "impression")]

    train, test = targets(world.train_days), targets(world.eval_days)
    per_ad = train.groupby("item_id")["label"].agg(["sum", "count"])
    prior = float(train["label"].mean())
    ctr = (per_ad["sum"] + prior_weight * prior) / (per_ad["count"] + prior_weight)
    return {"seen": float(test["item_id"].isin(per_ad.index).mean()), "ads": len(per_ad),
            "median_impressions": float(per_ad["count"].median()),
            "auc": auc(test["label"], test["item_id"].map(ctr).fillna(prior)), "prior_weight": prior_weight}


# counters_gbdt with and without the user's counters, and served_gbdt: the user's counters with the item statistics
# a server holds (the pipeline's item_windows) in place of the ad's CTR over the training days
GBDT = ("counters_gbdt", "ad_gbdt", "served_gbdt")
GBDT_CONTEXT = ["bucket", "surface", "device", "hour"]
TRAINING_DAYS_CTR = ["ad_ctr", "ad_impressions"]


def counter_rows(world: World, tcfg):
    """One row per target impression of every day: the counters the models also get (MTGR's cross
    features of the scored impression, models.data.cross_counts under the serving delay: the user's
    events per action with the same ad / category / brand or any, in 1 and 30 days), its position
    bucket, surface, device and hour, the user's history length, the label, the impression id. Built once per world, split
    and counter definition (workdir/counter-rows-<key>.parquet). benchmarks/history_probe.py fits trees on
    hand-made history features instead; these are the models' own inputs."""
    import hashlib

    import pandas as pd

    from models.data.samples import iter_samples
    from models.data.teacher_tokens import teacher_tokens
    from models.data.tokens import F_DEVICE, F_HOUR, F_ITEM, F_SURFACE

    key = hashlib.sha256(json.dumps(["impression_id", world.train_days, world.eval_days,
                                     tcfg.features.cross_windows_days, tcfg.mask.delay_ms]
                                    + (["item_stats"] if tcfg.features.item_stats else [])).encode()).hexdigest()[:12]
    path = world.home / "quality" / f"counter-rows-{key}.parquet"
    if path.exists():
        return pd.read_parquet(path)
    fc, frames = tcfg.features, []
    for day in world.train_days + world.eval_days:
        for s in iter_samples(world.samples([day]), fc):
            tt = teacher_tokens(s, fc, 1 << 40, tcfg.mask.delay_ms)  # no budget: every event counts
            if not len(tt.targets.label):
                continue
            f = tt.feats[tt.is_target]
            d = pd.DataFrame(tt.cross, columns=[f"cross{i}" for i in range(tt.cross.shape[1])])
            d = d.assign(bucket=tt.targets.bucket, label=tt.targets.label, user_id=tt.targets.user_id,
                         impression_id=tt.targets.impression_id,
                         item=f[:, F_ITEM], surface=f[:, F_SURFACE], device=f[:, F_DEVICE], hour=f[:, F_HOUR],
                         history_tokens=int((tt.ts < tt.ts[tt.is_target].min()).sum()), day=day)
            frames.append(d)
    rows = pd.concat(frames, ignore_index=True)
    rows.to_parquet(path, index=False)
    return rows


def counters_gbdt(world: World, tcfg, seed: int, variant: str = "counters_gbdt", extra=None) -> dict:
    """The pre-sequence industrial ranker on the same days: gradient-boosted trees (sklearn's
    HistGradientBoostingClassifier) on counter_rows and the context. ``variant`` says what they know of the ad:
    - ``counters_gbdt``: the ad's click-through rate over the training days, with its impression count (shrunk with
      20 pseudo-impressions at the window's CTR; out of day for a training row, so a row never sees its own click,
      but it does see the later training days, and the test day's rate includes the day before it, which the
      pipeline's store holds only a day later: a rate no server holds, kept as the reference of issue #34's table);
    - ``ad_gbdt``: the same without the user's counters;
    - ``served_gbdt``: the peer on the student's own inputs: the user's counters and the item statistics the
      pipeline serves (``models.data.item_stat_features`` of the samples' `item_windows` counts, 7 and 28 days
      ending two days before the impression), nothing of the training days' outcomes beyond them.
    Trees stop on a seeded 15 % validation split of the training rows; tested on the test day(s) as every model
    is (the same target impressions). ``extra``: a DataFrame of further columns by impression_id, given to the trees
    beside the others (benchmarks/effect_headroom.py gives them the simulator's true terms)."""
    import dataclasses

    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    from models.metrics import summarize_predictions

    served = variant == "served_gbdt"
    if served:
        tcfg = dataclasses.replace(tcfg, features=dataclasses.replace(tcfg.features, item_stats=True))
    rows = counter_rows(world, tcfg)
    if extra is not None:
        rows = rows.merge(extra, on="impression_id", how="left", validate="one_to_one")
    train, test = rows[rows["day"].isin(world.train_days)].copy(), rows[rows["day"].isin(world.eval_days)].copy()
    if not served:
        prior, k = float(train["label"].mean()), 20.0
        per_day = train.groupby(["item", "day"])["label"].agg(["sum", "count"])
        total = per_day.groupby(level="item").sum()
        own = per_day.reindex(list(zip(train["item"], train["day"]))).to_numpy()
        clicks, shown = total.reindex(train["item"]).to_numpy().T - own.T
        train["ad_ctr"], train["ad_impressions"] = (clicks + k * prior) / (shown + k), shown
        tot = total.reindex(test["item"]).fillna(0).to_numpy().T
        test["ad_ctr"], test["ad_impressions"] = (tot[0] + k * prior) / (tot[1] + k), tot[1]
    user = [c for c in rows.columns if c.startswith("cross")] + ["history_tokens"] if variant != "ad_gbdt" else []
    cols = user + GBDT_CONTEXT + ([] if served else TRAINING_DAYS_CTR)
    cols += [] if extra is None else [c for c in extra.columns if c != "impression_id"]
    trees = HistGradientBoostingClassifier(max_iter=500, learning_rate=0.05, early_stopping=True,
                                           validation_fraction=0.15, n_iter_no_change=20, random_state=seed,
                                           categorical_features=[cols.index("surface"), cols.index("device")])
    trees.fit(train[cols].to_numpy(np.float64), train["label"].to_numpy())
    pred = test.rename(columns={"bucket": "position_bucket"}).assign(
        p=trees.predict_proba(test[cols].to_numpy(np.float64))[:, 1])
    return {**summary_metrics(summarize_predictions(pred)), "best_epoch": float(trees.n_iter_)}
