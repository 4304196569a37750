"""How a model trains and is tested: every row from scratch through the pipeline's training entry points
(fit_model), and the pipeline's daily chain (warm-started students, teachers on its schedule)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from benchmarks.quality_suite.ablations import ABLATED, LearnedCountsTeacherConfig
from benchmarks.quality_suite.hstu import HSTUConfig
from benchmarks.quality_suite.variants import Recipe
from benchmarks.quality_suite.worlds import World


def summary_metrics(m: dict) -> dict:
    """The evaluation figures a result row keeps, NaN where missing."""
    keys = ("n", "auc", "gauc", "logloss", "ctr", "mean_p", "bucket0_calibration", "bucket1_calibration",
            "bucket0_n", "bucket1_n", "len_before_avg", "len_before_p90", "len_after_avg", "len_after_p90",
            "tokens_per_s")
    out = {k: (float(m[k]) if k in m and m[k] is not None else float("nan")) for k in keys}
    out["eval_tokens_per_s"] = out.pop("tokens_per_s")
    return out


def fit_model(kind: str, cfg, probs, train_days: list[str], world: World, recipe: Recipe, seed: int):
    """One model through the pipeline's entry point (train_teacher / train_student, TrainConfig.holdout: the
    newest training day's latest impressions pick the pass and calibrate); returns (model, a summary)."""
    import torch

    from models import fit_with_holdout, train_student, train_teacher

    tc, train = recipe.train(kind, seed), world.samples(train_days)
    if kind == "teacher":  # a batch's budget cuts every sample to it: a longer context needs batches that hold it
        tc = dataclasses.replace(tc, token_budget=max(tc.token_budget, cfg.max_len))
        if isinstance(cfg, (HSTUConfig, LearnedCountsTeacherConfig)):  # train_teacher's loop on the report's own teachers
            torch.manual_seed(seed)
            res = fit_with_holdout(cfg.build(), train, tc, warm=False)
        else:
            res = train_teacher(train, cfg, tc)
    elif isinstance(cfg, ABLATED):  # train_student's loop on the ablation's own Student subclass
        torch.manual_seed(seed)
        res = fit_with_holdout(cfg.build(), train, tc, probs)
    else:
        res = train_student(train, probs, cfg, tc)
    th = res.throughput
    return res.model, {"best_epoch": res.best_epoch, "val_auc": max(res.val_curve, default=float("nan")),
                       "val_curve": res.val_curve, "train_seconds": th["seconds"], "train_steps": res.step,
                       "train_tokens_per_s": th["tokens_per_s"], "train_events_per_s": th["events_per_s"]}


# The pipeline's daily protocol (assets/training.py), which fit_model's rows do not follow: a teacher
# retrained on `genrank demo`'s cadence over the days before it serves (teacher_due, TeacherTrainingConfig), its
# probabilities cached for each day it serves; from the first such day, the student of day D warm-starts from
# D-1's and trains on D alone (at most StudentTrainingConfig.warm_epochs passes, the first day cold), with the
# cached probabilities as KD targets or without them, and is calibrated on the held-out slices of the newest
# StudentTrainingConfig.calibration_days days. The two chains (variants.DAILY) train on the same days.
DAILY_TEACHER_EVERY_DAYS = 3   # `genrank demo --teacher-every-days` (the compressed weekly cadence)


def daily_teacher_probs(world: World, tcfg, recipe: Recipe, seed: int):
    """The teacher probabilities the daily pipeline caches for each training day (days before the first
    teacher get none), and the teachers' windows."""
    import pandas as pd

    from models import predict
    from assets.training import TeacherTrainingConfig, teacher_due

    tt, window, teacher, probs, windows = TeacherTrainingConfig(), None, None, [], []
    for day in world.train_days:
        before = [d for d in world.train_days if d < day]
        if teacher_due(day, before, window, DAILY_TEACHER_EVERY_DAYS, tt.min_days)[0]:
            days = before[-tt.window_days:]
            teacher, _ = fit_model("teacher", tcfg, None, days, world, recipe, seed)
            window = f"{days[0]}..{days[-1]}"
            windows.append(window)
        if teacher is not None:
            probs.append(predict(teacher, world.samples([day]))[["impression_id", "p"]].assign(day=day))
    return pd.concat(probs, ignore_index=True), windows


def daily_probs_path(world: World, seed: int) -> Path:
    return world.home / "quality" / f"daily-teacher-probs-seed{seed}.parquet"


def daily_chain(world: World, seed: int):
    """The daily teachers' cached probabilities of one seed (daily_teacher_probs, kept by run_seed) and the
    chain's days: those a teacher served."""
    import pandas as pd

    probs = pd.read_parquet(daily_probs_path(world, seed))
    return probs[["impression_id", "p"]], [d for d in world.train_days if d in set(probs["day"])]


def daily_student(world: World, scfg, recipe: Recipe, seed: int, probs, chain_days: list[str]):
    """The daily student chain over ``chain_days`` (KD targets ``probs`` or None); returns (model, a summary)."""
    import tempfile

    from models import calibrate_on_days, train_student
    from assets.training import StudentTrainingConfig

    st, tc = StudentTrainingConfig(), recipe.train("student", seed)
    model, seconds, steps, passes = None, 0.0, 0, []
    for day in chain_days:
        res = train_student(world.samples([day]), probs, scfg,
                            dataclasses.replace(tc, epochs=st.warm_epochs if model is not None else tc.epochs),
                            init_from=model)
        model, seconds, steps = res.model, seconds + res.throughput["seconds"], steps + res.step
        passes.append(res.best_epoch)
    # fit zeroes the calibration before training, so only the last day's fit needs the window's
    with tempfile.TemporaryDirectory(prefix="genrank-quality-cal-") as tmp:
        days = [d for d in world.train_days if d <= chain_days[-1]][-st.calibration_days:]
        calibrate_on_days(model, world.samples(days), tc.holdout, tmp)
    return model, {"best_epoch": res.best_epoch, "val_auc": max(res.val_curve, default=float("nan")),
                   "val_curve": res.val_curve, "train_seconds": seconds, "train_steps": steps,
                   "train_tokens_per_s": res.throughput["tokens_per_s"],
                   "train_events_per_s": res.throughput["events_per_s"], "chain": chain_days,
                   "passes_by_day": passes}
