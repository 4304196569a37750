"""Model-quality report (issues #8, #18): teacher, student, KD and the seed papers' ablations on three
simulated worlds (and MovieLens and MIND on request).

    .venv/bin/python benchmarks/quality_report.py --only no_history,teacher,student,student_kd   # 3 worlds, 3 seeds
    .venv/bin/python benchmarks/quality_report.py --quick         # tiny world, 1 seed, small models: minutes
    .venv/bin/python benchmarks/quality_report.py --worlds demo --seeds 1 --only student,no_litm
    .venv/bin/python benchmarks/quality_report.py --mind-only --only no_history,teacher,student,student_kd
    .venv/bin/python benchmarks/quality_report.py --obd-only       # the Open Bandit Dataset's real display positions

Its parts are in benchmarks/quality_suite/ (worlds, samples, oracle, baselines, variants, protocol,
runs, report); benchmarks/calibration_window.py and counter_probe.py reuse them.

Data. Each world of WORLDS (`--worlds`; a `genrank simulate` preset, seed, size and effect strengths) is
simulated into a private GENRANK_HOME under `--home` (default /tmp/genrank-quality/<world>) and the real
pipeline stages turn it
into training samples: the Dagster assets of the `ingest` and `sequences` groups (Spark events, dbt
sequences, their checks), one daily partition after the other as `genrank run` does, stopping before
the models. MovieLens latest-small goes through the importer (`genrank import movielens`, a
`--ml-since/--ml-until` slice with its empty days filled, so the partitions are contiguous) and the
same stages; so do MIND-small's 5,000-impression subset (`genrank import mind`, `--mind`) and the Open Bandit
Dataset's small sample, random logging policy, its three campaigns (`genrank import obd`, `--obd`: 30,000
impressions in real left/center/right slots over 7 days, users only as cohorts of their hashed features). All are
built once and reused (delete the folder to rebuild). The default MovieLens
slice, 2015-11-02..2015-11-18, is chosen because MovieLens is sparse in time (610 users over 22 years,
most of them rating in one burst), every calendar day costs a pipeline partition, and the sequence
stage cannot go past a day without events once it holds any (user_sequences' last built day is its
newest event's day, so the next day is refused): of the runs of consecutive days with ratings, this
17-day one has the most test ratings by users with earlier ratings in the slice.

Models. Exactly what the pipeline trains and serves (quality_suite.variants.Recipe.served: assets/training.py's
TeacherTrainingConfig().recipe() and StudentTrainingConfig().recipe(), the same sizes, TrainConfigs, early stopping
and calibration; tests/test_recipe.py fails if they part); `--quick` and MovieLens shrink it and say so.

Protocol. Every model trains from scratch on every day before the test day(s) through the pipeline's
own training entry points (models.train_teacher / train_student with TrainConfig.holdout, as
assets/training.py): the newest training day's latest `holdout` share of impressions is held out,
scored after every pass, training stops after `patience` passes without a better held-out AUC and
keeps the best pass, and the served head's per-bucket calibration is fitted on that slice. No variant
depends on a pass count tuned for another, and nothing is chosen on the test days. It is then tested out
of time on the last `--eval-days` day(s) under serving conditions (models.evaluate: delay mask on, the real bucket's
head). `--seeds` training seeds (initialisation and data order; the data stay the same). Reported:
mean and sample standard deviation over seeds, and per-seed paired differences (same seed, same test
impressions) with their spread, which is the noise against which every direction is judged.

Rows. The oracle's AUC (the simulator's true click probability with full information and with
serving visibility, on the tested impressions); the per-bucket historical-CTR baseline
(transforms.sequences.bucket_ctr_baseline); a student that sees no user history (quality_suite/ablations.py);
the teacher (CADET-style, full tokens); the student without and with KD (TM20K: main head on labels,
distill head on CE + lambda x KD against the teacher's probabilities on the training days, from
models.predict on the teacher); the student trained as the daily pipeline trains it (DAILY: warm-started
day by day, KD from teachers on the pipeline's schedule that never trained on the day), with and without KD;
the KD and teacher levers of issue #18 (LEVERS); ablations of the student without KD: no cross features (MTGR's
target-side counters, FeatureConfig.cross_windows_days=()), no position heads (position
as an input, the default slot at serving, one head), no delay mask in training, index RoPE instead
of time RoPE, no self-gating (input and Q/K gates), no QK-norm, LITM / PATM off (the served student carries no
LPTM: it has no layer to merge before). An HSTU-style ranker (`hstu`, quality_suite/hstu.py) sits beside the
teacher: its tokens, data and size with HSTU's layer. Results are kept in <world>/quality/results.json, so an
interrupted run resumes where it stopped (same sizes and days).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the models every real dataset runs (issue #34 item 6): no history, the student with and without KD, the teacher,
# and the trees, both kinds
REAL_DATA = ("counters_gbdt", "served_gbdt", "no_history", "teacher", "student", "student_kd")
sys.path.insert(0, str(ROOT))
from benchmarks.quality_suite.baselines import GBDT, ad_evidence, baseline_metrics  # noqa: E402
from benchmarks.quality_suite.oracle import evidence_oracle, oracle_rows  # noqa: E402
from benchmarks.quality_suite.report import table  # noqa: E402
from benchmarks.quality_suite.runs import run_seed  # noqa: E402
from benchmarks.quality_suite.variants import ABLATIONS, DAILY, LEVERS, Recipe, student_variant  # noqa: E402
from models.config import teacher_context  # noqa: E402
from benchmarks.quality_suite.worlds import (SEQUENCE_WORLDS, WORLDS, World, prepare_imported,  # noqa: E402
                                             prepare_simulated)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default=",".join(WORLDS),
                   help=f"comma-separated, of {', '.join({**WORLDS, **SEQUENCE_WORLDS})} (default {', '.join(WORLDS)})")
    p.add_argument("--seeds", type=int, default=None, help="training seeds 0..N-1 (default 3; --quick 1)")
    p.add_argument("--days", type=int, default=None, help="use only the first N simulated days (default all)")
    p.add_argument("--eval-days", type=int, default=1, help="last days, evaluated out of time (default 1)")
    p.add_argument("--epochs", type=int, default=None, help="most passes per model (default 12; --quick 4)")
    p.add_argument("--no-step-cap", action="store_true",
                   help="train without the served max_steps cap (ModelSizes.max_steps), for worlds larger than a "
                        "day's training was sized for: the passes and the held-out slice still decide")
    p.add_argument("--only", default=None, help="comma-separated subset of the models, e.g. student,no_litm "
                                                 "(student_kd needs teacher)")
    p.add_argument("--quick", action="store_true",
                   help="tiny world, 1 seed, small models, 4 passes at most, a 15-day MovieLens slice")
    p.add_argument("--home", default="/tmp/genrank-quality", help="where the worlds are built and cached")
    p.add_argument("--movielens", action="store_true", help="also MovieLens (no history effect there, see RESULTS)")
    p.add_argument("--movielens-only", action="store_true", help="skip the simulated worlds")
    p.add_argument("--ml-src", default=str(ROOT.parent / "shared" / "data" / "movielens_latest_small"))
    p.add_argument("--ml-since", default=None, help="first MovieLens day landed (default 2015-11-02)")
    p.add_argument("--ml-until", default=None, help="last MovieLens day landed (default 2015-11-18)")
    p.add_argument("--ml-eval-days", type=int, default=None, help="default 5")
    p.add_argument("--ml-seeds", type=int, default=None, help="training seeds on MovieLens (default 10: a model "
                                                                 "trains there in seconds; --quick 1)")
    p.add_argument("--ml-epochs", type=int, default=30, help="most passes per model on MovieLens (patience 4)")
    p.add_argument("--mind", action="store_true", help="also MIND-small's 5,000-impression subset (issue #18 item 7): "
                                                       "no-history, teacher, student, KD")
    p.add_argument("--mind-only", action="store_true", help="MIND alone")
    p.add_argument("--mind-src", default=str(ROOT.parent / "shared" / "data" / "mind_small_subset"))
    p.add_argument("--obd", action="store_true", help="also the Open Bandit Dataset's small sample (random policy, "
                                                      "real display positions; issue #34 item 6)")
    p.add_argument("--obd-only", action="store_true", help="OBD alone")
    p.add_argument("--obd-src", default=str(ROOT.parent / "shared" / "data" / "open_bandit_dataset_small"))
    p.add_argument("--obd-eval-days", type=int, default=2,
                   help="OBD's last days tested (default 2: a day holds about 19 clicks)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("GENRANK_TORCH_THREADS", "1")))
    p.add_argument("--out", default=None, help="also write the report (markdown) to this file")
    return p


def report_world(world: World, wv: list[str], recipe: Recipe, seeds: list[int]) -> str:
    """Trains and tests the models ``wv`` of every seed on one world (reusing kept results); its table."""
    print(f"\n{world.name}: train {world.train_days[0]}..{world.train_days[-1]} (its newest day's latest "
          f"impressions held out), test {world.eval_days[0]}..{world.eval_days[-1]}; "
          f"models {', '.join(wv)}; seeds {seeds}", flush=True)
    # results are kept per world and reused by a rerun with the same sizes and split (an interrupted run resumes)
    results_path = world.home / "quality" / "results.json"
    fingerprint = json.dumps({"recipe": repr(recipe), "train": world.train_days, "eval": world.eval_days},
                             sort_keys=True)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if results.get("_fingerprint") != fingerprint:
        results = {"_fingerprint": fingerprint}
    results_path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        tmp = results_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        os.replace(tmp, results_path)

    extra = {"baseline": baseline_metrics(world), "ads": ad_evidence(world)}
    t0 = time.perf_counter()
    for seed in seeds:
        run_seed(world, recipe, seed, wv, results, save)
    if world.simulated:
        from models import predict

        # the evaluated impressions and their labels (any model's predict gives the same rows; this one is fast)
        labels = predict(student_variant(recipe.student, "no_history").build(), world.samples(world.eval_days),
                         with_labels=True)[["impression_id", "label"]]
        extra["oracle"] = {**oracle_rows(world, labels), **evidence_oracle(world, labels)}
    print(f"  models on {world.name}: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    return table(world, results, seeds, wv, extra)


def report_recipe(a: argparse.Namespace) -> Recipe:
    """What the simulated worlds' rows train: the served recipe, changed only by the flags that say so."""
    recipe = Recipe.served()
    if a.quick:  # a smoke run, not what serves: smaller models, fewer passes
        r = dataclasses.replace
        recipe = r(recipe.replace_train(epochs=4),
                   teacher=r(recipe.teacher, max_len=teacher_context(256), backbone=r(recipe.teacher.backbone, d_model=32)),
                   student=r(recipe.student, max_len=256, backbone=r(recipe.student.backbone, d_model=32)))
    if a.epochs:
        recipe = recipe.replace_train(epochs=a.epochs)
    if a.no_step_cap:
        recipe = recipe.replace_train(max_steps=None)
    return recipe


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    q = a.quick
    n_seeds = a.seeds if a.seeds is not None else (1 if q else 3)
    ml_since = a.ml_since or ("2018-02-13" if q else "2015-11-02")
    ml_until = a.ml_until or ("2018-02-27" if q else "2015-11-18")
    ml_eval = a.ml_eval_days if a.ml_eval_days is not None else 5
    recipe = report_recipe(a)
    # MovieLens slices are small (hundreds to a few thousand ratings): more, cheap passes, more patience
    # and smaller batches, else a pass is one or two optimizer steps
    ml_recipe = recipe.replace_train(epochs=a.ml_epochs, patience=4, token_budget=512)

    import torch

    torch.set_num_threads(a.threads)
    os.environ["GENRANK_TORCH_THREADS"] = str(a.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    started = time.perf_counter()
    seeds = list(range(n_seeds))
    variants = [*GBDT, "no_history", "counters_no_history", "teacher", "student", "student_kd", "student_kd_oot", *DAILY,
                *LEVERS,
                "no_cross_features", "item_stats", *ABLATIONS]
    if a.only:
        unknown = set(a.only.split(",")) - set(variants)
        if unknown:
            p.error(f"--only: unknown model(s) {', '.join(sorted(unknown))}")
        variants = [v for v in variants if v in a.only.split(",")]
    home = Path(a.home).resolve()
    command = "benchmarks/quality_report.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"`{command.strip()}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d} ({platform.machine()}, "
              f"{os.cpu_count()} CPU(s), torch {torch.__version__}, {a.threads} thread(s)). Models: "
              f"{'--quick, smaller than what serves: ' if q else 'what the pipeline trains and serves: '}"
              f"{recipe.describe()}.")
    print(header, flush=True)
    worlds = []
    if not (a.movielens_only or a.mind_only or a.obd_only):
        specs = {"tiny": {"preset": "tiny", "seed": 0}} if q else {**WORLDS, **SEQUENCE_WORLDS}
        for name in (["tiny"] if q else a.worlds.split(",")):
            if name not in specs:
                p.error(f"--worlds: unknown world {name!r} (one of {', '.join(specs)})")
            worlds.append((prepare_simulated(home / name, name, specs[name], a.days, a.eval_days), variants, recipe,
                           seeds))
    if a.movielens or a.movielens_only:
        ml = prepare_imported("movielens", f"MovieLens latest-small, {ml_since}..{ml_until} (empty days filled)",
                              home / f"movielens-{ml_since}-{ml_until}", Path(a.ml_src), ml_eval, since=ml_since,
                              until=ml_until, fill_gaps=True)
        mt = ml_recipe.student_train
        ml.note = (f"At most {mt.epochs} passes, patience {mt.patience}, {mt.token_budget} tokens per batch. "
                   "MovieLens has no display position "
                   "(every impression is position 1, one bucket): the per-bucket baseline is one CTR per day, so its "
                   "AUC only reflects day-to-day CTR changes.")
        worlds.append((ml, [v for v in variants if v in REAL_DATA], ml_recipe,
                       list(range(a.ml_seeds if a.ml_seeds is not None else (1 if q else 10)))))

    def imported(dataset: str, name: str, src: str, eval_days: int, note: str, extra: tuple = ()) -> None:
        world = prepare_imported(dataset, name, home / dataset, Path(src), eval_days)
        world.note = note
        worlds.append((world, [v for v in variants if v in REAL_DATA + extra], recipe, seeds))

    if a.mind or a.mind_only:
        imported("mind", "MIND-small train, 5,000-impression subset (2019-11-09..14; click histories landed untimed on "
                 "2019-11-08)", a.mind_src, a.eval_days,
                 "Every impression is position 1 (MIND shuffles its lists), so one bucket; news side features cover "
                 "~4 % of the news ids; most users have one request in the subset, so a user's history is its "
                 "untimed click history from before the split.")
    if a.obd or a.obd_only:
        imported("obd", "Open Bandit Dataset small, random policy, campaigns all, men and women (2019-11-24..30)",
                 a.obd_src, a.obd_eval_days,
                 "Real display positions (1 left, 2 center, 3 right) under a uniform-random policy, so position and "
                 "item are independent. OBD has no user id: a user is a cohort sharing the four hashed user "
                 "features (about 250), so a history is the cohort's, not a person's.", ("no_position_heads",))
    prep_s = time.perf_counter() - started

    out = [header, ""]
    for world, wv, world_recipe, seeds in worlds:
        out.append(report_world(world, wv, world_recipe, seeds))
    total = time.perf_counter() - started
    out.append(f"Run time: {total / 60:.1f} min in all, of which {prep_s / 60:.1f} min building the worlds' training "
               f"samples through the pipeline (cached: 0 on a rerun).")
    text = "\n".join(out)
    print("\n" + text, flush=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
