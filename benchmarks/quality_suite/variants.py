"""The models the report trains: the pipeline's own teacher and student (Recipe.served), and every row's variant
of them: issue #18's levers (LEVERS), the seed papers' ablations (ABLATIONS) and the daily chain (DAILY)."""
from __future__ import annotations

import dataclasses
import math

from benchmarks.quality_suite.ablations import (DeepAdapterConfig, LearnedCountsConfig, LearnedCountsTeacherConfig,
                                                NoHistoryConfig, PositionInputConfig, ablated)
from benchmarks.quality_suite.hstu import HSTUConfig
from models.config import RoPEConfig

# the seed papers' ablations of the student without KD (report.py SEED_EXPECTATIONS: their published effects).
# TM20K's LPTM has none: the served student (2 layers, StudentConfig.lptm_every 2) has no layer it could merge
# before, so it is served without it (models.config.student_config).
ABLATIONS = ["no_position_heads", "no_train_delay", "index_rope", "no_gates", "no_qk_norm", "no_litm", "no_patm"]
# the student trained as the pipeline's daily chain trains it (protocol.py), without and with KD
DAILY = ("student_daily", "student_daily_kd")


ROPE_HOURS = RoPEConfig(phi_min=2 * math.pi, base=365 * 24)


def _bb(**kw):
    return lambda cfg: dataclasses.replace(cfg, backbone=dataclasses.replace(cfg.backbone, **kw))


# Issue #18's levers, each one change against "teacher", "student" or "student_kd": (trains a teacher, a
# student or a KD student, the config change, the row's label). Measured, not defaults: RESULTS.md "Model
# quality" says what each did.
LEVERS = {
    "teacher_6_layers": ("teacher", _bb(n_layers=6), "teacher, 6 layers instead of 4"),
    "teacher_d96": ("teacher", _bb(d_model=96), "teacher, d=96 instead of 64"),
    "teacher_no_id_dropout": ("teacher", _bb(id_dropout=0.0), "teacher, no id dropout"),
    "teacher_token_counters": ("teacher", lambda c: dataclasses.replace(c, counter_len=None),
                               "teacher, counters over its kept tokens only (before counter_len)"),
    "counters_no_ids": ("student", lambda c: ablated(_bb(id_dropout=1.0)(c), NoHistoryConfig, keep_counters=True),
                        "student on the counters, no history tokens, ids dropped in training"),
    "student_2k_history": ("student", lambda c: dataclasses.replace(c, max_len=2048),
                           "student, 2,048 history events instead of 1,024"),
    # issue #34 item 5: the counters through a deeper adapter (the counter probe's MLP beats the student on them)
    "student_deep_adapter": ("student", lambda c: ablated(c, DeepAdapterConfig),
                             "student, the counters' adapter with 2 hidden layers instead of 1"),
    # issue #33: counters whose match is learnt, for the sequence worlds' complement and abandonment terms
    "student_learned_counts": ("student", lambda c: ablated(c, LearnedCountsConfig),
                               "student + learnt-match counters (a category relation, signed brand actions)"),
    "teacher_learned_counts": ("teacher", lambda c: ablated(c, LearnedCountsTeacherConfig),
                               "teacher + learnt-match counters over its outcome tokens"),
    "student_kd_learned_teacher": ("kd", lambda c: c, "student, KD from the learnt-match teacher",
                                   "teacher_learned_counts"),
    "learned_counts_kd": ("kd", lambda c: ablated(c, LearnedCountsConfig),
                          "student + learnt-match counters, KD from the learnt-match teacher", "teacher_learned_counts"),
    # time RoPE that resolves hours: CADET's defaults (phi_min 1e-4 over a year, base 6e5) turn the fastest pair 0.16
    # rad a day, so neither model can tell an event of the last hour from one of last week by its rotation; these
    # span one turn a year (slowest) to one turn an hour (fastest, the serving delay), the counters' scale
    "teacher_rope_hours": ("teacher", lambda c: dataclasses.replace(c, rope=ROPE_HOURS),
                           "teacher, time RoPE from 1 hour to 1 year"),
    "student_rope_hours": ("student", lambda c: dataclasses.replace(c, rope=ROPE_HOURS),
                           "student, time RoPE from 1 hour to 1 year"),
    "student_window_counters": ("student", lambda c: dataclasses.replace(c, counter_len=None),
                                "student, counters over its 1,024 history events only (before counter_len)"),
    "student_kd_lambda1": ("kd", lambda c: dataclasses.replace(c, kd_lambda=1.0), "student, KD lambda 1 instead of 50"),
    "student_kd_lambda5": ("kd", lambda c: dataclasses.replace(c, kd_lambda=5.0), "student, KD lambda 5 instead of 50"),
    "student_kd_t2": ("kd", lambda c: dataclasses.replace(c, kd_temperature=2.0), "student, KD temperature 2"),
    # Privileged-features distillation (Taobao's PFD, KDD 2020; Lopez-Paz et al. 2016): a teacher that sees what
    # serving cannot, here everything strictly before each target (delay 1 ms instead of the 1-hour serving
    # delay: the last hour's events and outcomes, in its attention and its counters), trained and scored so; its
    # probabilities are better targets than the labels for a student that sees only what serving sees.
    "teacher_privileged": ("teacher", lambda c: dataclasses.replace(c, mask=dataclasses.replace(c.mask, delay_ms=1)),
                           "teacher, privileged: sees everything before each target, scored so (vs the full-information oracle)"),
    # issue #34 item 4: HSTU's layer (pointwise SiLU attention, relative time bias) on the teacher's tokens, data and
    # size, in place of CADET's gated softmax block (hstu.py)
    "hstu": ("teacher", HSTUConfig.like, "HSTU-style ranker (the teacher's tokens and size, HSTU's layer)"),
    # KD from a lever's teacher (the fourth element) instead of the default one
    "student_kd_privileged": ("kd", lambda c: c, "student, KD from the privileged teacher", "teacher_privileged"),
}
# teacher levers scored with more than serving visibility: their oracle is the full-information one
PRIVILEGED = {"teacher_privileged"}

LABELS = {
    "bucket_ctr": "per-bucket historical CTR",
    "counters_gbdt": "trees on the user's counters, the ad's CTR and the context (best epoch: trees)",
    "ad_gbdt": "trees on the ad's CTR and the context",
    "served_gbdt": "trees on the user's counters, the served item statistics and the context",
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
    "no_gates": "- no self-gating (CADET's input gate and Q/K gates off)",
    "no_qk_norm": "- no QK-norm",
    "no_litm": "- LITM off",
    "no_patm": "- PATM off",
    "no_cross_features": "- no cross features (MTGR)",
    "item_stats": "student with item statistics (the ad's and campaign's counts)",
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the report trains: the teacher and the student with their TrainConfigs. ``served()`` is exactly what the
    pipeline trains and serves (assets.training's run configuration defaults, their ``recipe()``); the benchmark
    only sets the seed and turns logging and checkpoints off (``for_seed``). ``--quick`` and MovieLens shrink it
    explicitly (quality_report.py says so in the report)."""
    teacher: object
    teacher_train: object
    student: object
    student_train: object

    @classmethod
    def served(cls) -> "Recipe":
        from assets.training import StudentTrainingConfig, TeacherTrainingConfig

        return cls(*TeacherTrainingConfig().recipe(), *StudentTrainingConfig().recipe())

    def train(self, kind: str, seed: int):
        """The TrainConfig of the teacher or the student for one seed (what the pipeline trains with, seeded)."""
        base = self.teacher_train if kind == "teacher" else self.student_train
        return dataclasses.replace(base, seed=seed, log_every=10**9, ckpt_every=0, device="cpu")

    def replace_train(self, **changes) -> "Recipe":
        """Both TrainConfigs changed alike (the passes, the batch size)."""
        r = dataclasses.replace
        return r(self, teacher_train=r(self.teacher_train, **changes), student_train=r(self.student_train, **changes))

    def describe(self) -> str:
        t, s, tt, st = self.teacher, self.student, self.teacher_train, self.student_train
        cap = "no step cap" if st.max_steps is None else f"{st.max_steps} steps"
        return (f"d={t.backbone.d_model}, {t.backbone.n_heads} heads, teacher {t.backbone.n_layers} layers / {t.max_len} "
                f"tokens, student {s.backbone.n_layers} layers / {s.max_len} events, counters over {s.counter_len} "
                f"events (LITM, PATM{f', LPTM every {s.lptm_every} layers' if s.lptm else ''}; KD lambda {s.kd_lambda:g}, temperature "
                f"{s.kd_temperature:g}); AdamW lr {tt.lr:g} / {st.lr:g} (teacher / student), wd {st.weight_decay:g}, "
                f"{tt.token_budget} / {st.token_budget} tokens per batch, at most {st.epochs} passes and "
                f"{cap}; the latest {st.holdout:.0%} of the newest training day's impressions pick the "
                f"pass (stop after {st.patience} without a better AUC, keep the best) and fit the per-bucket calibration")


def student_variant(base, name: str):
    r = dataclasses.replace
    if name in ("student", "student_kd", "student_kd_oot", *DAILY):
        return base
    if name in LEVERS:
        return LEVERS[name][1](base)
    if name == "no_history":
        return ablated(base, NoHistoryConfig)
    if name == "counters_no_history":
        return ablated(base, NoHistoryConfig, keep_counters=True)
    if name == "no_cross_features":
        return r(base, features=r(base.features, cross_windows_days=()))
    if name == "item_stats":
        return r(base, features=r(base.features, item_stats=True))
    if name == "no_position_heads":
        return ablated(base, PositionInputConfig, backbone=r(base.backbone, n_buckets=1))
    if name == "no_train_delay":
        return r(base, mask=r(base.mask, train_delay=False))
    if name == "index_rope":
        return r(base, rope=RoPEConfig(mode="index"))
    if name == "no_gates":
        return _bb(input_gate=False, qk_gate=False)(base)
    if name == "no_qk_norm":
        return _bb(qk_norm=False)(base)
    if name in ("no_litm", "no_patm"):
        return r(base, **{name.removeprefix("no_"): False})
    raise ValueError(name)
