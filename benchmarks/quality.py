"""Model-quality report (issues #8, #18): teacher, student, KD and the seed papers' ablations on three
simulated worlds (and MovieLens and MIND on request).

    .venv/bin/python benchmarks/quality.py --only no_history,teacher,student,student_kd   # 3 worlds, 3 seeds
    .venv/bin/python benchmarks/quality.py --quick         # tiny world, 1 seed, small models: minutes
    .venv/bin/python benchmarks/quality.py --worlds demo --seeds 1 --only student,no_lptm
    .venv/bin/python benchmarks/quality.py --mind-only --only no_history,teacher,student,student_kd

Data. Each world of WORLDS (`--worlds`; a `genrank simulate` preset, seed, size and effect strengths) is
simulated into a private GENRANK_HOME under `--home` (default /tmp/genrank-quality/<world>) and the real
pipeline stages turn it
into training samples: the Dagster assets of the `ingest` and `sequences` groups (Spark events, dbt
sequences, their checks), one daily partition after the other as `genrank run` does, stopping before
the models. MovieLens latest-small goes through the importer (`genrank import movielens`, a
`--ml-since/--ml-until` slice with its empty days filled, so the partitions are contiguous) and the
same stages; so does MIND-small's 5,000-impression subset (`genrank import mind`, `--mind`). All are
built once and reused (delete the folder to rebuild). The default MovieLens
slice, 2015-11-02..2015-11-18, is chosen because MovieLens is sparse in time (610 users over 22 years,
most of them rating in one burst), every calendar day costs a pipeline partition, and the sequence
stage cannot go past a day without events once it holds any (user_sequences' last built day is its
newest event's day, so the next day is refused): of the runs of consecutive days with ratings, this
17-day one has the most test ratings by users with earlier ratings in the slice.

Protocol. Every model trains from scratch on every day before the test day(s) through the pipeline's
own training entry points (models.train_teacher / train_student with TrainConfig.holdout, as
pipelines/assets/training.py): the newest training day's latest Sizes.holdout share of impressions is held out,
scored after every pass, training stops after Sizes.patience passes without a better held-out AUC and
keeps the best pass, and the served head's per-bucket calibration is fitted on that slice. No variant
depends on a pass count tuned for another, and nothing is chosen on the test days. It is then tested out
of time on the last `--eval-days` day(s) under serving conditions (models.evaluate: delay mask on, the real bucket's
head). `--seeds` training seeds (initialisation and data order; the data stay the same). Reported:
mean and sample standard deviation over seeds, and per-seed paired differences (same seed, same test
impressions) with their spread, which is the noise against which every direction is judged.

Rows. The oracle's AUC (the simulator's true click probability with full information and with
serving visibility, on the tested impressions); the per-bucket historical-CTR baseline
(transforms.sequences.bucket_ctr_baseline); a student that sees no user history (use_history=False);
the teacher (CADET-style, full tokens); the student without and with KD (TM20K: main head on labels,
distill head on CE + lambda x KD against the teacher's probabilities on the training days, from
models.predict on the teacher); the student trained as the daily pipeline trains it (DAILY: warm-started
day by day, KD from teachers on the pipeline's schedule that never trained on the day), with and without KD;
the KD and teacher levers of issue #18 (LEVERS); ablations of the student without KD: no cross features (MTGR's
target-side counters, FeatureConfig.cross_windows_days=()), no position heads (position
as an input, the default slot at serving, one head), no delay mask in training, index RoPE instead
of time RoPE, LITM / PATM / LPTM off. Results are kept in <world>/quality/results.json, so an
interrupted run resumes where it stopped (same sizes and days).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this file's folder comes first on sys.path when run as a script: it would shadow the `quality` package
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

log = logging.getLogger("genrank.quality")

# Seed papers' figures (relative AUC change of the ablated model vs the full one), ../shared/seeds.
SEED_EXPECTATIONS = {
    "no_position_heads": ("CADET", -0.61),
    "no_train_delay": ("CADET", -0.31),
    "index_rope": ("CADET", -0.13),
    "no_litm": ("TM20K", +0.02),   # TM20K: adding LITM costs 0.02 %, so removing it gains as much
    "no_patm": ("TM20K", +0.06),
    "no_lptm": ("TM20K", +0.03),
}
ABLATIONS = ["no_position_heads", "no_train_delay", "index_rope", "no_litm", "no_patm", "no_lptm"]
def _bb(**kw):
    return lambda cfg: dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, **kw))


# Issue #18's levers, each one change against "teacher", "student" or "student_kd": (trains a teacher, a
# student or a KD student, the config change, the row's label). Measured, not defaults: RESULTS.md "Model
# quality" says what each did.
LEVERS = {
    "teacher_6_layers": ("teacher", _bb(n_layers=6), "teacher, 6 layers instead of 4"),
    "teacher_d96": ("teacher", _bb(d_model=96), "teacher, d=96 instead of 64"),
    "teacher_4k_context": ("teacher", lambda c: dataclasses.replace(c, max_len=4096), "teacher, 4,096 tokens instead of 2,048"),
    "teacher_no_id_dropout": ("teacher", _bb(id_dropout=0.0), "teacher, no id dropout"),
    "teacher_token_counters": ("teacher", lambda c: dataclasses.replace(c, counter_len=None),
                               "teacher, counters over its kept tokens only (before counter_len)"),
    "counters_no_ids": ("student", lambda c: dataclasses.replace(_bb(id_dropout=1.0)(c), use_history=False,
                                                                 counters_without_history=True),
                        "student on the counters, no history tokens, ids dropped in training"),
    "student_2k_history": ("student", lambda c: dataclasses.replace(c, max_len=2048),
                           "student, 2,048 history events instead of 1,024"),
    "student_window_counters": ("student", lambda c: dataclasses.replace(c, counter_len=None),
                                "student, counters over its 1,024 history events only (before counter_len)"),
    "student_kd_lambda1": ("kd", lambda c: dataclasses.replace(c, kd_lambda=1.0), "student, KD lambda 1 instead of 50"),
    "student_kd_lambda5": ("kd", lambda c: dataclasses.replace(c, kd_lambda=5.0), "student, KD lambda 5 instead of 50"),
    "student_kd_t2": ("kd", lambda c: dataclasses.replace(c, kd_temperature=2.0), "student, KD temperature 2"),
    # KD from a lever's teacher (the fourth element) instead of the default one
    "student_kd_4k_teacher": ("kd", lambda c: c, "student, KD from the 4,096-token teacher", "teacher_4k_context"),
    # Privileged-features distillation (Taobao's PFD, KDD 2020; Lopez-Paz et al. 2016): a teacher that sees what
    # serving cannot, here everything strictly before each target (delay 1 ms instead of the 1-hour serving
    # delay: the last hour's events and outcomes, in its attention and its counters), trained and scored so; its
    # probabilities are better targets than the labels for a student that sees only what serving sees.
    "teacher_privileged": ("teacher", lambda c: dataclasses.replace(c, mask=dataclasses.replace(c.mask, delay_ms=1)),
                           "teacher, privileged: sees everything before each target, scored so (vs the full-information oracle)"),
    "student_kd_privileged": ("kd", lambda c: c, "student, KD from the privileged teacher", "teacher_privileged"),
}
# teacher levers scored with more than serving visibility: their oracle is the full-information one
PRIVILEGED = {"teacher_privileged"}


GBDT = ("counters_gbdt", "ad_gbdt")
LABELS = {
    "bucket_ctr": "per-bucket historical CTR",
    "counters_gbdt": "trees on the user's counters, the ad's CTR and the context (best epoch: trees)",
    "ad_gbdt": "trees on the ad's CTR and the context",
    "no_history": "student, no user history",
    "counters_no_history": "student on the counters, no history tokens",
    "teacher": "teacher (full tokens)",
    "student": "student, no KD",
    "student_kd": "student, KD",
    "student_kd_oot": "student, KD from a teacher that did not train on those days",
    "student_daily": "student, the pipeline's daily chain, no KD",
    "student_daily_kd": "student, the pipeline's daily chain with KD",
    **{k: v[2] for k, v in LEVERS.items()},
    "no_position_heads": "- no position heads (position input, default slot at serving, 1 head)",
    "no_train_delay": "- no delay mask in training",
    "index_rope": "- index RoPE instead of time RoPE",
    "no_litm": "- LITM off",
    "no_patm": "- PATM off",
    "no_lptm": "- LPTM off",
    "no_cross_features": "- no cross features (MTGR)",
}


# ------------------------------------------------------------------------------------ data

@dataclasses.dataclass
class World:
    name: str
    home: Path
    days: list[str]            # training_samples days, in order
    train_days: list[str]
    eval_days: list[str]       # the out-of-time test
    simulated: bool
    note: str = ""

    def samples(self, days) -> list[str]:
        return [str(self.home / "lake" / "training_samples" / f"date={d}") for d in days]


def _sample_days(home: Path) -> list[str]:
    root = home / "lake" / "training_samples"
    return sorted(p.name.removeprefix("date=") for p in root.glob("date=*")
                  if (p / "part-0.parquet").exists()) if root.is_dir() else []


def build_training_samples(home: Path) -> None:
    """Runs the pipeline's ingest and sequences assets (Spark events, dbt sequences and their checks)
    for every complete landing day without training samples yet, in order, in a child process: the
    partitions definition reads GENRANK_HOME at import, and the Spark JVM should not outlive it."""
    from transforms import landing

    landed = landing.complete_days(home)
    todo = [d for d in landed if d not in set(_sample_days(home))]
    if not todo:
        return
    # the first daily partition is the world's first landing day, as the `genrank` commands pin it
    env = {**os.environ, "GENRANK_HOME": str(home), "GENRANK_TORCH_THREADS": "1", "GENRANK_START_DATE": landed[0]}
    env.pop("DAGSTER_HOME", None)   # a private instance under the world's home
    logfile = home / "quality-pipeline.log"
    print(f"  pipeline (events + sequences) for {len(todo)} day(s) {todo[0]}..{todo[-1]}; log: {logfile}", flush=True)
    t0 = time.perf_counter()
    with open(logfile, "a") as out:
        rc = subprocess.run([sys.executable, __file__, "--_build-samples", str(home)], env=env, stdout=out,
                            stderr=subprocess.STDOUT, cwd=str(ROOT)).returncode
    if rc != 0:
        raise RuntimeError(f"the pipeline stages failed for {home} (exit {rc}); see {logfile}")
    print(f"  pipeline done in {time.perf_counter() - t0:.0f} s", flush=True)


def _build_samples_child(home: Path) -> int:
    """Child process of build_training_samples."""
    import dagster as dg

    from pipelines.runner import prepare_instance
    from transforms import landing

    instance = prepare_instance(home)
    from pipelines.definitions import defs
    from pipelines.partitions import daily_partitions

    selection = dg.AssetSelection.groups("ingest", "sequences") - dg.AssetSelection.assets("raw_logs")
    jobs = [dg.define_asset_job("quality_samples_job", selection=selection, partitions_def=daily_partitions()),
            dg.define_asset_job("quality_sequences_job", selection=dg.AssetSelection.groups("sequences"),
                                partitions_def=daily_partitions())]
    resolved = dg.Definitions(assets=list(defs.assets), asset_checks=list(defs.asset_checks or []), jobs=jobs,
                              resources=defs.resources)
    samples_job, sequences_job = (resolved.resolve_job_def(j.name) for j in jobs)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    tags = {"genrank/launched_by": "benchmarks/quality.py"}
    done = set(_sample_days(home))
    for day in landing.complete_days(home):
        if day in done:
            continue
        t0 = time.perf_counter()
        r = samples_job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False, run_config=quiet,
                                           tags=tags)
        failed = [f"{e.asset_key.to_user_string()}:{e.check_name}" for e in r.get_asset_check_evaluations()
                  if not e.passed and e.severity.value == "ERROR"]
        if not r.success and failed == ["events:events_not_empty"] and _landing_lines(home, day) == 0:
            # An empty landing day (the importer's --fill-gaps) stops the pipeline at the blocking check
            # events_not_empty, although its (empty) events partition is written; the sequences still need
            # the day for contiguous partitions, so they are built on their own.
            r = sequences_job.execute_in_process(partition_key=day, instance=instance, raise_on_error=False,
                                                 run_config=quiet, tags=tags)
            print(f"QUALITY {day} empty landing day: events_not_empty failed as designed; sequences alone "
                  f"success={r.success}", flush=True)
        print(f"QUALITY {day} success={r.success} {time.perf_counter() - t0:.1f}s", flush=True)
        if not r.success:
            return 1
    return 0


def _landing_lines(home: Path, day: str) -> int:
    from transforms import landing

    return sum(landing.open_day(home, day, verify=False).line_counts.values())


def _split(name: str, home: Path, days: list[str], eval_days: int, simulated: bool) -> World:
    if len(days) < eval_days + 2:
        raise ValueError(f"{home}: {len(days)} day(s) of training samples; need at least {eval_days + 2}")
    n_train = len(days) - eval_days
    return World(name, home, days, days[:n_train], days[n_train:], simulated=simulated)


# The worlds the report runs on (issue #18): the demo world and two others with other seeds, sizes and
# effect strengths (`genrank simulate` options, transforms/simulator/world.py Strengths), chosen before any
# model ran on them and never used to choose a training setting. "history-heavy": stronger session and
# long-range memory, so the user sequence carries more of the signal; "item-heavy": weaker history effects,
# stronger ad quality and a higher base rate (intercept -2.0: CTR 13.9 % against the demo's 6.9 %). Both are
# smaller than the demo world (fewer days: every day costs a pipeline partition on a 2-core machine).
WORLDS: dict[str, dict] = {
    "demo": {"preset": "demo", "seed": 0},
    "history-heavy": {"preset": "demo", "seed": 1, "strengths": "session=1.5,long_range=2,long_term=0.6",
                      "users": 250, "days": 6},
    "item-heavy": {"preset": "demo", "seed": 2, "strengths": "session=0.5,long_range=0.6,quality=0.9",
                   "users": 250, "days": 5, "bias_logit": -2.0},
}


def world_spec_text(spec: dict) -> str:
    opts = [f"--preset {spec['preset']}", f"--seed {spec['seed']}"]
    opts += [f"--{k.replace('_', '-')} {spec[k]}" for k in ("strengths", "users", "days", "bias_logit") if k in spec]
    return "genrank simulate " + " ".join(opts)


def prepare_simulated(home: Path, name: str, spec: dict, n_days: int | None, eval_days: int) -> World:
    from pipelines.cli import world_config
    from transforms import landing
    from transforms.simulator import simulate

    home.mkdir(parents=True, exist_ok=True)
    if not landing.complete_days(home):
        print(f"  {world_spec_text(spec)} into {home}", flush=True)
        config = world_config(spec["preset"], spec.get("strengths"), spec.get("users"), spec.get("days"),
                              spec.get("bias_logit"))
        with contextlib.redirect_stdout(sys.stderr):
            simulate(preset=spec["preset"], seed=spec["seed"], out=home, config=config)
    build_training_samples(home)
    days = _sample_days(home)
    if n_days:
        days = days[:n_days]
    return _split(f"world `{name}` ({world_spec_text(spec)})", home, days, eval_days, True)


def prepare_imported(dataset: str, name: str, home: Path, src: Path, eval_days: int, **options) -> World:
    """A public dataset through its importer (`genrank import <dataset>`) and the pipeline's stages."""
    from transforms import landing
    from transforms.importers import import_dataset

    home.mkdir(parents=True, exist_ok=True)
    if not landing.complete_days(home):
        print(f"  importing {name} into {home}", flush=True)
        report = import_dataset(dataset, src, home, **options)
        if not report.reconciled:
            raise RuntimeError(f"{dataset} import did not reconcile:\n{report.summary()}")
    build_training_samples(home)
    return _split(name, home, _sample_days(home), eval_days, False)


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


# ------------------------------------------------------------------------------------ models

@dataclasses.dataclass
class Sizes:
    d_model: int = 64
    n_heads: int = 2
    teacher_layers: int = 4
    student_layers: int = 4      # LPTM pair-sums before layer 2 (of 0..3): it needs >= 3 layers to act
    teacher_max_len: int = 2048  # tokens (an impression costs 2)
    student_max_len: int = 1024  # events
    counter_len: int = 4096      # events both models' counters count (ModelSizes.counter_events)
    epochs: int = 12             # at most; the held-out slice picks the pass (TrainConfig.patience, holdout)
    patience: int = 2            # TrainConfig.patience
    holdout: float = 0.2         # TrainConfig.holdout
    max_steps: int | None = None
    token_budget: int = 2048     # small packed batches: more optimizer steps per pass (as the pipeline)
    lr: float = 2e-3
    weight_decay: float = 0.1
    kd_lambda: float = 50.0      # StudentConfig.kd_lambda (TM20K)
    kd_temperature: float = 1.0  # StudentConfig.kd_temperature
    id_dropout: float = 0.5      # as the pipeline (models/config.py DEMO_SIZES)


def _configs(sz: Sizes):
    from models import BackboneConfig, StudentConfig, TeacherConfig
    from models.config import DEMO_SIZES, feature_config

    fc = feature_config(DEMO_SIZES)
    teacher = TeacherConfig(features=fc, max_len=sz.teacher_max_len, counter_len=sz.counter_len,
                            backbone=BackboneConfig(d_model=sz.d_model, n_layers=sz.teacher_layers, n_heads=sz.n_heads,
                                                    id_dropout=sz.id_dropout))
    student = StudentConfig(features=fc, max_len=sz.student_max_len, counter_len=sz.counter_len, kd_lambda=sz.kd_lambda,
                            kd_temperature=sz.kd_temperature,
                            backbone=BackboneConfig(d_model=sz.d_model, n_layers=sz.student_layers, n_heads=sz.n_heads,
                                                    id_dropout=sz.id_dropout))
    return teacher, student


def student_variant(base, name: str):
    from models import RoPEConfig

    r = dataclasses.replace
    if name in ("student", "student_kd", "student_kd_oot", *DAILY):
        return base
    if name in LEVERS:
        return LEVERS[name][1](base)
    if name == "no_history":
        return r(base, use_history=False)
    if name == "counters_no_history":
        return r(base, use_history=False, counters_without_history=True)
    if name == "no_cross_features":
        return r(base, features=r(base.features, cross_windows_days=()))
    if name == "no_position_heads":
        return r(base, position_input=True, backbone=r(base.backbone, n_buckets=1))
    if name == "no_train_delay":
        return r(base, mask=r(base.mask, train_delay=False))
    if name == "index_rope":
        return r(base, rope=RoPEConfig(mode="index"))
    if name in ("no_litm", "no_patm", "no_lptm"):
        return r(base, **{name.removeprefix("no_"): False})
    raise ValueError(name)


GBDT_CONTEXT = ["bucket", "surface", "device", "hour", "ad_ctr", "ad_impressions"]


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
                                     tcfg.features.cross_windows_days, tcfg.mask.delay_ms]).encode()).hexdigest()[:12]
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


def counters_gbdt(world: World, tcfg, seed: int, user_counters: bool = True) -> dict:
    """The pre-sequence industrial ranker on the same days: gradient-boosted trees (sklearn's
    HistGradientBoostingClassifier) on counter_rows and the ad's click-through rate over the training
    days (shrunk with 20 pseudo-impressions at the window's CTR; out of day for a training row, so a
    row never sees its own click), with its impression count. ``user_counters=False`` keeps the ad and
    the context only. Trees stop on a seeded 15 % validation split of the training rows; tested on the
    test day(s) as every model is (the same target impressions)."""
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    from models.metrics import summarize_predictions

    rows = counter_rows(world, tcfg)
    train, test = rows[rows["day"].isin(world.train_days)].copy(), rows[rows["day"].isin(world.eval_days)].copy()
    prior, k = float(train["label"].mean()), 20.0
    per_day = train.groupby(["item", "day"])["label"].agg(["sum", "count"])
    total = per_day.groupby(level="item").sum()
    own = per_day.reindex(list(zip(train["item"], train["day"]))).to_numpy()
    clicks, shown = total.reindex(train["item"]).to_numpy().T - own.T
    train["ad_ctr"], train["ad_impressions"] = (clicks + k * prior) / (shown + k), shown
    tot = total.reindex(test["item"]).fillna(0).to_numpy().T
    test["ad_ctr"], test["ad_impressions"] = (tot[0] + k * prior) / (tot[1] + k), tot[1]
    cols = ([c for c in rows.columns if c.startswith("cross")] + ["history_tokens"] if user_counters else []) \
        + GBDT_CONTEXT
    trees = HistGradientBoostingClassifier(max_iter=500, learning_rate=0.05, early_stopping=True,
                                           validation_fraction=0.15, n_iter_no_change=20, random_state=seed,
                                           categorical_features=[cols.index("surface"), cols.index("device")])
    trees.fit(train[cols].to_numpy(np.float64), train["label"].to_numpy())
    pred = test.rename(columns={"bucket": "position_bucket"}).assign(
        p=trees.predict_proba(test[cols].to_numpy(np.float64))[:, 1])
    return {**_metrics(summarize_predictions(pred)), "best_epoch": float(trees.n_iter_)}


def _train_cfg(sz: Sizes, seed: int):
    from models import TrainConfig

    return TrainConfig(lr=sz.lr, weight_decay=sz.weight_decay, token_budget=sz.token_budget, epochs=sz.epochs,
                       patience=sz.patience, holdout=sz.holdout, max_steps=sz.max_steps, seed=seed, warmup_steps=20,
                       log_every=10**9, ckpt_every=0, device="cpu")


def _metrics(m: dict) -> dict:
    keys = ("n", "auc", "gauc", "logloss", "ctr", "mean_p", "bucket0_calibration", "bucket1_calibration",
            "bucket0_n", "bucket1_n", "len_before_avg", "len_before_p90", "len_after_avg", "len_after_p90",
            "tokens_per_s")
    out = {k: (float(m[k]) if k in m and m[k] is not None else float("nan")) for k in keys}
    out["eval_tokens_per_s"] = out.pop("tokens_per_s")
    return out


def fit_model(kind: str, cfg, probs, train_days: list[str], world: World, sz: Sizes, seed: int):
    """One model through the pipeline's entry point (train_teacher / train_student, TrainConfig.holdout: the
    newest training day's latest impressions pick the pass and calibrate); returns (model, a summary)."""
    from models import train_student, train_teacher

    tc, train = _train_cfg(sz, seed), world.samples(train_days)
    if kind == "teacher":  # a batch's budget cuts every sample to it: a longer context needs batches that hold it
        tc = dataclasses.replace(tc, token_budget=max(tc.token_budget, cfg.max_len))
    res = train_teacher(train, cfg, tc) if kind == "teacher" else train_student(train, probs, cfg, tc)
    th = res.throughput
    return res.model, {"best_epoch": res.best_epoch, "val_auc": max(res.val_curve, default=float("nan")),
                       "val_curve": res.val_curve, "train_seconds": th["seconds"], "train_steps": res.step,
                       "train_tokens_per_s": th["tokens_per_s"], "train_events_per_s": th["events_per_s"]}


# The pipeline's daily protocol (pipelines/assets/training.py), which the rows above do not follow: a teacher
# retrained on `genrank demo`'s cadence over the days before it serves (teacher_due, TeacherTrainingConfig), its
# probabilities cached for each day it serves; from the first such day, the student of day D warm-starts from
# D-1's and trains on D alone (at most StudentTrainingConfig.warm_epochs passes, the first day cold), with the
# cached probabilities as KD targets or without them, and is calibrated on the held-out slices of the newest
# StudentTrainingConfig.calibration_days days. The two chains train on the same days.
DAILY = ("student_daily", "student_daily_kd")
DAILY_TEACHER_EVERY_DAYS = 3   # `genrank demo --teacher-every-days` (the compressed weekly cadence)


def daily_teacher_probs(world: World, tcfg, sz: Sizes, seed: int):
    """The teacher probabilities the daily pipeline caches for each training day (days before the first
    teacher get none), and the teachers' windows."""
    import pandas as pd

    from models import predict
    from pipelines.assets.training import TeacherTrainingConfig, teacher_due

    tt, window, teacher, probs, windows = TeacherTrainingConfig(), None, None, [], []
    for day in world.train_days:
        before = [d for d in world.train_days if d < day]
        if teacher_due(day, before, window, DAILY_TEACHER_EVERY_DAYS, tt.min_days)[0]:
            days = before[-tt.window_days:]
            teacher, _ = fit_model("teacher", tcfg, None, days, world, sz, seed)
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


def daily_student(world: World, scfg, sz: Sizes, seed: int, probs, chain_days: list[str]):
    """The daily student chain over ``chain_days`` (KD targets ``probs`` or None); returns (model, a summary)."""
    import tempfile

    from models import calibrate_on_days, train_student
    from pipelines.assets.training import StudentTrainingConfig

    st, tc = StudentTrainingConfig(), _train_cfg(sz, seed)
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


def run_seed(world: World, sz: Sizes, seed: int, variants: list[str], results: dict, save) -> None:
    """Trains and evaluates every model of one seed (skipping those already in results)."""
    import pandas as pd

    from models import evaluate, predict
    from models.metrics import auc

    tcfg, scfg = _configs(sz)
    evald = world.samples(world.eval_days)
    workdir = world.home / "quality"
    workdir.mkdir(parents=True, exist_ok=True)
    key = lambda v: f"{world.name}|{v}|{seed}"  # noqa: E731
    probs_path = workdir / f"teacher-probs-seed{seed}.parquet"
    kd = [v for v in variants if v == "student_kd" or (v in LEVERS and LEVERS[v][0] == "kd")]
    kd_needs_probs = any(key(v) not in results for v in kd) and not probs_path.exists()
    if "teacher" in variants and (key("teacher") not in results or kd_needs_probs):
        t0 = time.perf_counter()
        model, fit = fit_model("teacher", tcfg, None, world.train_days, world, sz, seed)
        results[key("teacher")] = {**_metrics(evaluate(model, evald)), **fit}
        # the teacher's probabilities on the student's training days (TM20K: cached teacher logits)
        probs = predict(model, world.samples(world.train_days), with_labels=True)
        results[key("teacher")]["in_sample_auc"] = auc(probs["label"], probs["p"])
        probs[["impression_id", "p"]].to_parquet(probs_path, index=False)
        _report(world, "teacher", seed, results[key("teacher")], time.perf_counter() - t0)
        save()
    def lever_teacher(v: str):
        """A teacher lever's model; its probabilities on the training days are kept for a KD lever that names it."""
        model, fit = fit_model("teacher", LEVERS[v][1](tcfg), None, world.train_days, world, sz, seed)
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
        model, _ = fit_model("teacher", tcfg, None, world.train_days[:half], world, sz, seed)
        predict(model, world.samples(world.train_days[half:]))[["impression_id", "p"]].to_parquet(oot_path, index=False)
    if any(v in DAILY and key(v) not in results for v in variants) and not daily_probs_path(world, seed).exists():
        daily, windows = daily_teacher_probs(world, tcfg, sz, seed)
        daily.to_parquet(daily_probs_path(world, seed), index=False)
        print(f"  [{world.name}] seed {seed} daily teachers {', '.join(windows)}", flush=True)
    for v in variants:
        if v == "teacher" or key(v) in results:
            continue
        t0 = time.perf_counter()
        if v in GBDT:
            results[key(v)] = counters_gbdt(world, tcfg, seed, user_counters=v == "counters_gbdt")
            print(f"  [{world.name}] seed {seed} {v:18s} auc {results[key(v)]['auc']:.4f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
            save()
            continue
        if v in LEVERS and LEVERS[v][0] == "teacher":
            model, fit = lever_teacher(v)
        elif v in DAILY:
            daily, chain = daily_chain(world, seed)
            model, fit = daily_student(world, scfg, sz, seed, daily if v == "student_daily_kd" else None, chain)
        else:
            probs = pd.read_parquet(oot_path if v == "student_kd_oot" else kd_probs(v)) if v in kd + ["student_kd_oot"] \
                else None
            model, fit = fit_model("student", student_variant(scfg, v), probs, world.train_days, world, sz, seed)
        results[key(v)] = {**_metrics(evaluate(model, evald)), **fit}
        _report(world, v, seed, results[key(v)], time.perf_counter() - t0)
        save()


def _report(world: World, v: str, seed: int, m: dict, seconds: float) -> None:
    print(f"  [{world.name}] seed {seed} {v:18s} auc {m['auc']:.4f} gauc {m['gauc']:.4f} logloss {m['logloss']:.4f} "
          f"calib {m['bucket0_calibration']:.2f}/{m['bucket1_calibration']:.2f} val {m['val_curve']} -> epoch "
          f"{m['best_epoch']}; train {m['train_seconds']:.0f}s ({m['train_steps']} steps, {m['train_tokens_per_s']:.0f} "
          f"tok/s); total {seconds:.0f}s", flush=True)


# ------------------------------------------------------------------------------------ table

def _mean_sd(xs) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def _fmt(m: float, sd: float, nd: int = 4) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{nd}f}" + ("" if math.isnan(sd) else f" ± {sd:.{nd}f}")


def _per_seed(results, world, v, seeds, k):
    return [results.get(f"{world.name}|{v}|{s}", {}).get(k, float("nan")) for s in seeds]


def table(world: World, results: dict, seeds: list[int], variants: list[str], extra: dict) -> str:
    b = extra["baseline"]
    lines = [f"#### {world.name}", "",
             f"Train {world.train_days[0]}..{world.train_days[-1]} ({len(world.train_days)} days; the latest "
             f"impressions of {world.train_days[-1]} held out to pick the pass and calibrate), "
             f"out-of-time test {_span(world.eval_days)} ({len(world.eval_days)} day(s): "
             f"{int(b['n']):,} impressions of {_n_users(world):,} users, CTR {b['ctr']:.4f}). "
             f"Mean ± sd over seeds {', '.join(map(str, seeds))}." + (f" {world.note}" if world.note else ""), ""]
    lines += ["| model | AUC | GAUC | log-loss | pred/obs CTR bucket 0 / 1 | history events -> tokens (avg, p90) "
              "| train tokens/s | train events/s | best epoch |", "|---|---|---|---|---|---|---|---|---|"]
    if "oracle" in extra:
        o = extra["oracle"]
        lines.append(f"| oracle, full information | {o['auc_full']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility (nothing newer than 1 h) | {o['auc_serving']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility, each ad's quality as the training days show it | "
                     f"{o['auc_evidence']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility, no ad quality | {o['auc_no_ad_quality']:.4f} | | | | | | | |")
    lines.append(f"| {LABELS['bucket_ctr']} | {b['auc']:.4f} | {b['gauc']:.4f} | {b['logloss']:.4f} | "
                 f"{_cal(b.get('bucket0_calibration'))} / {_cal(b.get('bucket1_calibration'))} | | | | |")
    for v in variants:
        g = lambda k: _mean_sd(_per_seed(results, world, v, seeds, k))  # noqa: E731
        if math.isnan(g("auc")[0]):
            continue
        epochs = "/".join(str(int(x)) if not math.isnan(x) else "-"
                          for x in _per_seed(results, world, v, seeds, "best_epoch"))
        n = lambda k: "-" if math.isnan(g(k)[0]) else f"{g(k)[0]:,.0f}"  # noqa: E731
        lines.append(
            f"| {LABELS[v]} | {_fmt(*g('auc'))} | {_fmt(*g('gauc'))} | {_fmt(*g('logloss'))} | "
            f"{_cal(g('bucket0_calibration')[0])} / {_cal(g('bucket1_calibration')[0])} | "
            f"{n('len_before_avg')} -> {n('len_after_avg')} ({n('len_before_p90')} -> {n('len_after_p90')}) | "
            f"{n('train_tokens_per_s')} | {n('train_events_per_s')} | {epochs} |")
    lines.append("")
    if "oracle" in extra:
        o = extra["oracle"]
        lines.append(f"Oracle rows: the simulator's p_click / p_click_serving on {o['n']:,} of the {o['n_eval']:,} "
                     f"tested impressions (joined by impression_id, scored against the pipeline's labels); the runner's "
                     f"per-day figure (serving, every logged impression): "
                     + ", ".join(f"{d} {v:.4f}" for d, v in o["runner_auc_serving"].items() if v is not None) + ".")
    if "oracle" in extra:
        for v in [v for v in variants if v == "teacher" or LEVERS.get(v, ("",))[0] == "teacher"]:
            if v in PRIVILEGED:
                gap = [extra["oracle"]["auc_full"] - x for x in _per_seed(results, world, v, seeds, "auc")]
                if not math.isnan(_mean_sd(gap)[0]):
                    lines.append(f"Oracle (full information) - {LABELS[v]}: {_fmt(*_mean_sd(gap))} AUC.")
                continue
            gap = [extra["oracle"]["auc_serving"] - x for x in _per_seed(results, world, v, seeds, "auc")]
            if not math.isnan(_mean_sd(gap)[0]):
                reach = [extra["oracle"]["auc_evidence"] - x for x in _per_seed(results, world, v, seeds, "auc")]
                lines.append(f"Oracle (serving visibility) - {LABELS[v]}: {_fmt(*_mean_sd(gap))} AUC; the same "
                             f"oracle knowing the ads only from the training days - {LABELS[v]}: "
                             f"{_fmt(*_mean_sd(reach))}.")
    if "ads" in extra:
        a = extra["ads"]
        lines.append(f"Ads: {a['seen']:.1%} of the tested impressions show an ad seen in the training days; the "
                     f"{a['ads']:,} ads there had a median of {a['median_impressions']:.0f} training impressions; an "
                     f"ad's training CTR alone (shrunk with {a['prior_weight']:.0f} pseudo-impressions) scores AUC "
                     f"{a['auc']:.4f} on the test day(s).")
    t_in = _mean_sd(_per_seed(results, world, "teacher", seeds, "in_sample_auc"))
    if not math.isnan(t_in[0]):
        lines.append(f"Teacher AUC on its own training days (the KD targets): {_fmt(*t_in)}.")
    lines.append("")
    lines += derived(world, results, seeds, variants)
    return "\n".join(lines)


def _span(days: list[str]) -> str:
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"


def _cal(x) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


def _n_users(world: World) -> int:
    import pyarrow.parquet as pq

    users = set()
    for path in world.samples(world.eval_days):
        t = pq.read_table(path, columns=["user_id", "is_target"])
        users |= set(t.filter(t.column("is_target")).column("user_id").to_pylist())
    return len(users)


def _paired(results, world, a, b, seeds, k="auc"):
    xa, xb = _per_seed(results, world, a, seeds, k), _per_seed(results, world, b, seeds, k)
    return [x - y for x, y in zip(xa, xb) if not (math.isnan(x) or math.isnan(y))]


def _verdict(diffs: list[float], expected: float) -> str:
    """Direction of the paired per-seed differences vs the seed paper's, with 2 standard errors as noise."""
    m, sd = _mean_sd(diffs)
    if math.isnan(m):
        return "-"
    if len(diffs) < 2:
        return ("same sign" if (m > 0) == (expected > 0) else "opposite sign") + " (1 seed: no spread)"
    se = sd / math.sqrt(len(diffs))
    if abs(m) <= 2 * se:
        return f"within seed noise (2 SE = {2 * se:.4f})"
    return ("same direction" if (m > 0) == (expected > 0) else "**opposite direction**") + " (beyond 2 SE)"


def _share(results, world, seeds, v) -> list[float]:
    t, k, n = (_per_seed(results, world, x, seeds, "auc") for x in ("teacher", v, "no_history"))
    return [(kk - nn) / (tt - nn) if abs(tt - nn) > 1e-9 else float("nan") for tt, kk, nn in zip(t, k, n)]


def derived(world: World, results: dict, seeds: list[int], variants: list[str]) -> list[str]:
    """Paired per-seed differences (the same seed, data and evaluation; the seed spread is the noise)."""
    rows = []
    ref = _mean_sd(_per_seed(results, world, "student", seeds, "auc"))[0]

    def row(label, a, b, paper, expected):
        d, dg = _paired(results, world, a, b, seeds), _paired(results, world, a, b, seeds, "gauc")
        if not d:
            return
        m = _mean_sd(d)[0]
        rel = f"{100 * m / ref:+.2f} %" if ref and not math.isnan(ref) else "-"
        rows.append(f"| {label} | {_fmt(*_mean_sd(d))} | {rel} | {_fmt(*_mean_sd(dg))} | {paper} | "
                    f"{_verdict(d, expected)} |")

    row("user history: student (no KD) - no-history student", "student", "no_history",
        "CADET, TM20K: the user sequence is the signal (TM20K: 5K -> 20K events +0.26 % rel.)", +1)
    row("teacher - no-history student", "teacher", "no_history", "TM20K: the full-token teacher is the upper bound", +1)
    row("teacher - student (no KD)", "teacher", "student", "TM20K: teacher +0.11 % rel. over the student", +1)
    row("teacher - trees on the counters", "teacher", "counters_gbdt",
        "issue #18: a sequence model above the counters it is given", +1)
    row("student (no KD) - trees on the counters", "student", "counters_gbdt",
        "issue #18: a sequence model above the counters it is given", +1)
    row("no-history student - trees on the ad's CTR and context", "no_history", "ad_gbdt",
        "issue #18: ids learnt as well as the ad's CTR counter", +1)
    row("KD: student with KD - student without", "student_kd", "student", "TM20K: +0.07 % rel.", +1)
    row("KD from a teacher that did not train on those days - student (no KD)", "student_kd_oot", "student",
        "issue #18: the pipeline's KD targets are out of time", +1)
    row("the pipeline's daily chain with KD - the same chain without", "student_daily_kd", "student_daily",
        "issue #18: KD that pays, in the pipeline's own protocol", +1)
    row("the pipeline's daily chain, no KD - student (no KD, every day at once)", "student_daily", "student",
        "issue #18: what warm-started days cost", +1)
    for v, (kind, _, label, *_) in LEVERS.items():
        base = {"teacher": "teacher", "student": "student"}.get(kind, "student_kd")
        row(f"{label} - {LABELS[base]}", v, base, "issue #18 lever", +1)
        if kind == "kd":
            row(f"{label} - student (no KD)", v, "student", "issue #18: KD that pays", +1)
    row("no cross features - student (no KD)", "no_cross_features", "student",
        "MTGR: -1.25 pp CTR GAUC without its cross features", -1)
    for v in ABLATIONS:
        if v in variants:
            paper, exp = SEED_EXPECTATIONS[v]
            row(f"{LABELS[v].lstrip('- ')} - student (no KD)", v, "student", f"{paper}: {exp:+.2f} % rel.", exp)
    out = []
    if rows:
        out += ["| paired difference (per seed, then mean ± sd) | AUC | AUC rel. | GAUC | seed paper | here |",
                "|---|---|---|---|---|---|", *rows, ""]
    pct = lambda xs: ", ".join("-" if math.isnan(x) else f"{100 * x:.0f} %" for x in xs)  # noqa: E731
    if all(v in variants for v in ("teacher", "no_history", *DAILY)):
        kd, nokd = _share(results, world, seeds, "student_daily_kd"), _share(results, world, seeds, "student_daily")
        out += [f"The same share for the pipeline's daily chain: with KD {pct(kd)} (mean {100 * _mean_sd(kd)[0]:.0f} %), "
                f"without KD {pct(nokd)} (mean {100 * _mean_sd(nokd)[0]:.0f} %).", ""]
    if all(v in variants for v in ("teacher", "student", "student_kd", "no_history")):
        kd, nokd = _share(results, world, seeds, "student_kd"), _share(results, world, seeds, "student")
        gain = _paired(results, world, "teacher", "no_history", seeds)
        if any(g <= 0 for g in gain):
            out += [f"The teacher does not beat the no-history student on every seed (teacher - no-history: "
                    f"{', '.join(f'{g:+.4f}' for g in gain)}), so the share of its gain a student recovers is not "
                    "meaningful on those seeds; the ratios are printed anyway."]
        out += [f"Share of the teacher's AUC gain over the no-history student that the student recovers, "
                f"(student - no-history) / (teacher - no-history): with KD {pct(kd)} (mean {100 * _mean_sd(kd)[0]:.0f} %), "
                f"without KD {pct(nokd)} (mean {100 * _mean_sd(nokd)[0]:.0f} %), per seed. TM20K: 85 % with KD, "
                f"58 % without (relative to its 5K baseline).", ""]
    return out


# ------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--_build-samples":
        return _build_samples_child(Path(sys.argv[2]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default=",".join(WORLDS), help=f"comma-separated, of {', '.join(WORLDS)} (default all)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds 0..N-1 (default 3; --quick 1)")
    p.add_argument("--days", type=int, default=None, help="use only the first N simulated days (default all)")
    p.add_argument("--eval-days", type=int, default=1, help="last days, evaluated out of time (default 1)")
    p.add_argument("--epochs", type=int, default=None, help="most passes per model (default 12; --quick 4)")
    p.add_argument("--only", default=None, help="comma-separated subset of the models, e.g. student,no_lptm "
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
    p.add_argument("--threads", type=int, default=int(os.environ.get("GENRANK_TORCH_THREADS", "1")))
    p.add_argument("--out", default=None, help="also write the report (markdown) to this file")
    a = p.parse_args(argv)
    q = a.quick
    n_seeds = a.seeds if a.seeds is not None else (1 if q else 3)
    ml_since = a.ml_since or ("2018-02-13" if q else "2015-11-02")
    ml_until = a.ml_until or ("2018-02-27" if q else "2015-11-18")
    ml_eval = a.ml_eval_days if a.ml_eval_days is not None else 5
    sz = Sizes()
    if q:
        sz = dataclasses.replace(sz, d_model=32, teacher_max_len=512, student_max_len=256, epochs=4)
    if a.epochs:
        sz = dataclasses.replace(sz, epochs=a.epochs)
    # MovieLens slices are small (hundreds to a few thousand ratings): more, cheap passes, more patience
    # and smaller batches, else a pass is one or two optimizer steps
    ml_sz = dataclasses.replace(sz, epochs=a.ml_epochs, patience=4, token_budget=512)

    import torch

    torch.set_num_threads(a.threads)
    os.environ["GENRANK_TORCH_THREADS"] = str(a.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    started = time.perf_counter()
    seeds = list(range(n_seeds))
    variants = [*GBDT, "no_history", "counters_no_history", "teacher", "student", "student_kd", "student_kd_oot", *DAILY,
                *LEVERS,
                "no_cross_features", *ABLATIONS]
    if a.only:
        unknown = set(a.only.split(",")) - set(variants)
        if unknown:
            p.error(f"--only: unknown model(s) {', '.join(sorted(unknown))}")
        variants = [v for v in variants if v in a.only.split(",")]
    home = Path(a.home).resolve()
    command = "benchmarks/quality.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"`{command.strip()}` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d} ({platform.machine()}, "
              f"{os.cpu_count()} CPU(s), torch {torch.__version__}, {a.threads} thread(s)). Models: d={sz.d_model}, "
              f"{sz.n_heads} heads, teacher {sz.teacher_layers} layers / {sz.teacher_max_len} tokens, student "
              f"{sz.student_layers} layers / {sz.student_max_len} events (LITM T=3, PATM, LPTM every 2 layers, KD lambda "
              f"{sz.kd_lambda:g}, temperature {sz.kd_temperature:g}); AdamW lr {sz.lr:g}, wd {sz.weight_decay:g}, "
              f"{sz.token_budget} tokens per batch, at most {sz.epochs} passes; the latest {sz.holdout:.0%} of the newest "
              f"training day's impressions pick the pass (stop after {sz.patience} without a better AUC, keep the best) and "
              "fit the per-bucket calibration.")
    print(header, flush=True)
    worlds = []
    if not (a.movielens_only or a.mind_only):
        specs = {"tiny": {"preset": "tiny", "seed": 0}} if q else WORLDS
        for name in (["tiny"] if q else a.worlds.split(",")):
            if name not in specs:
                p.error(f"--worlds: unknown world {name!r} (one of {', '.join(specs)})")
            worlds.append((prepare_simulated(home / name, name, specs[name], a.days, a.eval_days), variants, sz, seeds))
    if a.movielens or a.movielens_only:
        ml = prepare_imported("movielens", f"MovieLens latest-small, {ml_since}..{ml_until} (empty days filled)",
                              home / f"movielens-{ml_since}-{ml_until}", Path(a.ml_src), ml_eval, since=ml_since,
                              until=ml_until, fill_gaps=True)
        ml.note = (f"At most {ml_sz.epochs} passes, patience {ml_sz.patience}, {ml_sz.token_budget} tokens per batch. "
                   "MovieLens has no display position "
                   "(every impression is position 1, one bucket): the per-bucket baseline is one CTR per day, so its "
                   "AUC only reflects day-to-day CTR changes.")
        worlds.append((ml, [v for v in variants if v in ("no_history", "student")], ml_sz,
                       list(range(a.ml_seeds if a.ml_seeds is not None else (1 if q else 10)))))
    if a.mind or a.mind_only:
        mind = prepare_imported("mind", "MIND-small train, 5,000-impression subset (2019-11-09..14; click histories "
                                "landed untimed on 2019-11-08)", home / "mind", Path(a.mind_src), a.eval_days)
        mind.note = ("Every impression is position 1 (MIND shuffles its lists), so one bucket; news side features "
                     "cover ~4 % of the news ids; most users have one request in the subset, so a user's history is "
                     "its untimed click history from before the split.")
        worlds.append((mind, [v for v in variants if v in ("no_history", "teacher", "student", "student_kd")], sz, seeds))
    prep_s = time.perf_counter() - started

    out = [header, ""]
    for world, wv, wsz, seeds in worlds:
        print(f"\n{world.name}: train {world.train_days[0]}..{world.train_days[-1]} (its newest day's latest "
              f"impressions held out), test {world.eval_days[0]}..{world.eval_days[-1]}; "
              f"models {', '.join(wv)}; seeds {seeds}", flush=True)
        # results are kept per world and reused by a rerun with the same sizes and split (an interrupted run resumes)
        results_path = world.home / "quality" / "results.json"
        fingerprint = json.dumps({"sizes": dataclasses.asdict(wsz), "train": world.train_days,
                                  "eval": world.eval_days}, sort_keys=True)
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
        if results.get("_fingerprint") != fingerprint:
            results = {"_fingerprint": fingerprint}
        results_path.parent.mkdir(parents=True, exist_ok=True)

        def save(results=results, results_path=results_path):
            tmp = results_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            os.replace(tmp, results_path)

        extra = {"baseline": baseline_metrics(world), "ads": ad_evidence(world)}
        t0 = time.perf_counter()
        for seed in seeds:
            run_seed(world, wsz, seed, wv, results, save)
        if world.simulated:
            from models import predict
            from models.train import build_model

            _, scfg = _configs(wsz)
            # the evaluated impressions and their labels (any model's predict gives the same rows)
            labels = predict(build_model(student_variant(scfg, "no_history")), world.samples(world.eval_days),
                             with_labels=True)[["impression_id", "label"]]
            extra["oracle"] = {**oracle_rows(world, labels), **evidence_oracle(world, labels)}
        print(f"  models on {world.name}: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
        out.append(table(world, results, seeds, wv, extra))
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
