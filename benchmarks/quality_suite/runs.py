"""One seed's models on one world: each trained (protocol.py) and tested on the test days, its row kept in the
world's results (so an interrupted run resumes)."""
from __future__ import annotations

import time
from pathlib import Path

from benchmarks.quality_suite.baselines import GBDT, counters_gbdt
from benchmarks.quality_suite.protocol import (daily_chain, daily_probs_path, daily_student, daily_teacher_probs,
                                               fit_model, summary_metrics)
from benchmarks.quality_suite.variants import DAILY, LEVERS, Recipe, student_variant
from benchmarks.quality_suite.worlds import World


def run_seed(world: World, recipe: Recipe, seed: int, variants: list[str], results: dict, save) -> None:
    """Trains and evaluates every model of one seed (skipping those already in results)."""
    import pandas as pd

    from models import evaluate, predict
    from models.metrics import auc

    tcfg, scfg = recipe.teacher, recipe.student
    evald = world.samples(world.eval_days)
    workdir = world.home / "quality"
    workdir.mkdir(parents=True, exist_ok=True)
    key = lambda v: f"{world.name}|{v}|{seed}"  # noqa: E731
    probs_path = workdir / f"teacher-probs-seed{seed}.parquet"
    kd = [v for v in variants if v == "student_kd" or (v in LEVERS and LEVERS[v][0] == "kd")]
    kd_needs_probs = any(key(v) not in results for v in kd) and not probs_path.exists()
    if "teacher" in variants and (key("teacher") not in results or kd_needs_probs):
        t0 = time.perf_counter()
        model, fit = fit_model("teacher", tcfg, None, world.train_days, world, recipe, seed)
        results[key("teacher")] = {**summary_metrics(evaluate(model, evald)), **fit}
        # the teacher's probabilities on the student's training days (TM20K: cached teacher logits)
        probs = predict(model, world.samples(world.train_days), with_labels=True)
        results[key("teacher")]["in_sample_auc"] = auc(probs["label"], probs["p"])
        probs[["impression_id", "p"]].to_parquet(probs_path, index=False)
        _report(world, "teacher", seed, results[key("teacher")], time.perf_counter() - t0)
        save()

    def lever_teacher(v: str):
        """A teacher lever's model; its probabilities on the training days are kept for a KD lever that names it."""
        model, fit = fit_model("teacher", LEVERS[v][1](tcfg), None, world.train_days, world, recipe, seed)
        if any(LEVERS[k][3:] == (v,) for k in kd if k in LEVERS):
            predict(model, world.samples(world.train_days))[["impression_id", "p"]].to_parquet(
                workdir / f"{v}-probs-seed{seed}.parquet", index=False)
        return model, fit

    def kd_probs(v: str) -> Path:
        if v not in LEVERS or len(LEVERS[v]) < 4:
            return probs_path
        path = workdir / f"{LEVERS[v][3]}-probs-seed{seed}.parquet"
        if not path.exists():  # its teacher's row may be cached without its probabilities: train it again
            lever_teacher(LEVERS[v][3])
        return path

    oot_path = workdir / f"teacher-oot-probs-seed{seed}.parquet"
    if "student_kd_oot" in variants and key("student_kd_oot") not in results and not oot_path.exists():
        # as in the pipeline: KD targets from a teacher that never trained on them. A teacher on the first half
        # of the training days scores the second half; the first half gets no KD term (no teacher probability).
        half = len(world.train_days) // 2
        model, _ = fit_model("teacher", tcfg, None, world.train_days[:half], world, recipe, seed)
        predict(model, world.samples(world.train_days[half:]))[["impression_id", "p"]].to_parquet(oot_path, index=False)
    if any(v in DAILY and key(v) not in results for v in variants) and not daily_probs_path(world, seed).exists():
        daily, windows = daily_teacher_probs(world, tcfg, recipe, seed)
        daily.to_parquet(daily_probs_path(world, seed), index=False)
        print(f"  [{world.name}] seed {seed} daily teachers {', '.join(windows)}", flush=True)
    for v in variants:
        if v == "teacher" or key(v) in results:
            continue
        t0 = time.perf_counter()
        if v in GBDT:
            results[key(v)] = counters_gbdt(world, tcfg, seed, v)
            print(f"  [{world.name}] seed {seed} {v:18s} auc {results[key(v)]['auc']:.4f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
            save()
            continue
        if v in LEVERS and LEVERS[v][0] == "teacher":
            model, fit = lever_teacher(v)
        elif v in DAILY:
            daily, chain = daily_chain(world, seed)
            model, fit = daily_student(world, scfg, recipe, seed, daily if v == "student_daily_kd" else None, chain)
        else:
            probs = pd.read_parquet(oot_path if v == "student_kd_oot" else kd_probs(v)) if v in kd + ["student_kd_oot"] \
                else None
            model, fit = fit_model("student", student_variant(scfg, v), probs, world.train_days, world, recipe, seed)
        results[key(v)] = {**summary_metrics(evaluate(model, evald)), **fit}
        _report(world, v, seed, results[key(v)], time.perf_counter() - t0)
        save()


def _report(world: World, v: str, seed: int, m: dict, seconds: float) -> None:
    print(f"  [{world.name}] seed {seed} {v:18s} auc {m['auc']:.4f} gauc {m['gauc']:.4f} logloss {m['logloss']:.4f} "
          f"calib {m['bucket0_calibration']:.2f}/{m['bucket1_calibration']:.2f} val {m['val_curve']} -> epoch "
          f"{m['best_epoch']}; train {m['train_seconds']:.0f}s ({m['train_steps']} steps, {m['train_tokens_per_s']:.0f} "
          f"tok/s); total {seconds:.0f}s", flush=True)
