"""Configuration dataclasses for the models package.

Every default names its source: CADET = seed 000, TM20K = seed 001,
HSTU/MTGR = seed 002, SORT = seed 003 (../shared/seeds). Defaults that the
seeds do not give are marked "ours". Model *sizes* default to the seeds'
production values; ModelSizes (the pipeline's, preset "demo") and the tiny preset override them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from contracts import HOUR_MS
YEAR_S = 365.0 * 24 * 3600


@dataclass
class FeatureConfig:
    """Hashed-id embedding tables (rows per field). Row 0 of every field is null."""

    item_buckets: int = 1 << 18        # ours: ad_id / item_id share one table (x d_model floats!)
    campaign_buckets: int = 1 << 16    # ours
    advertiser_buckets: int = 1 << 15  # ours
    category_buckets: int = 1 << 12    # ours
    brand_buckets: int = 1 << 15       # ours
    surface_buckets: int = 64          # ours
    device_buckets: int = 64           # ours
    max_position: int = 50             # ours: positions above are clipped
    dwell_buckets: int = 16            # ours: log2-second buckets
    hash_key: str = "genrank-hash-v01"  # 16 chars, pandas.util.hash_array key
    # MTGR keeps statistical cross features on the target token (dropping them cost 1.25pp CTR GAUC):
    # per scored impression, counts of the user's visible events by action and by match on the candidate
    # (any / same ad-item / category / brand), in each of these trailing windows (models.data.cross_counts).
    # Windows are ours, the usual counter windows; () switches the cross features off.
    cross_windows_days: tuple[float, ...] = (1.0, 30.0)
    # The item-side statistics beside them (contracts.ITEM_STAT_COLUMNS, issue #34): the ad's and campaign's
    # impressions and clicks of every user, counted before the serving lag (models.data.item_stat_features).
    # What trees on the ad's CTR had and the sequence models lacked. Off in what the pipeline trains until they
    # pay: on (3 seeds) they cost 0.0018 AUC on the demo world and gained 0.0011 on item-heavy, and in `make
    # demo` the first champion fell from 0.865 to 0.851 (benchmarks/RESULTS.md, "Item statistics against the
    # trees"); their log counts grow with the days a young world's windows cover. The sequence build computes
    # them and the store serves them either way; the quality report's `item_stats` variant turns them on.
    item_stats: bool = False
    # ours: the smoothed CTRs' pseudo-impressions (benchmarks' trees shrink the ad's CTR with the same 20) and
    # the campaign's prior, where an id never shown sits (the ad's prior is its campaign's smoothed CTR)
    item_stats_pseudo_impressions: float = 20.0
    item_stats_prior_ctr: float = 0.05

    def table_sizes(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.endswith("_buckets")}


@dataclass
class RoPEConfig:
    """Time RoPE, angle_i(t) = t * phi_min / dt_max * base^(2i/d) (CADET eq., seed 000)."""

    mode: str = "time"        # "time" (CADET), "index" (standard RoPE, ablation) or "none"
    dt_max_s: float = YEAR_S  # CADET: maximum look-back, 1 year
    phi_min: float = 1e-4     # CADET: rotation of the slowest pair over dt_max
    base: float = 6e5         # CADET: ratio fastest/slowest; barely separates hours (see DESIGN)
    index_base: float = 10000.0  # standard RoPE base for mode="index"


@dataclass
class MaskConfig:
    """The single interval contract: query q attends keys in [lo_q, hi_q) plus itself."""

    delay_ms: int = HOUR_MS      # CADET: training-time delay mask, 1 h
    train_delay: bool = True     # CADET ablation: False trains with delay 0; validation always uses delay_ms
    window: int | None = None    # SORT local attention window W (None = full history)
    n_global: int = 0            # SORT: the newest G history tokens keep the full range (global queries)


@dataclass
class BackboneConfig:
    d_model: int = 352           # CADET offline model: hidden 352
    n_layers: int = 8            # CADET: 8 layers
    n_heads: int = 4             # CADET: 4 heads
    mlp_ratio: float = 2.0       # TM20K: SwiGLU 1024 for hidden 512
    dropout: float = 0.0
    # ours: in training, each token's ad/item, campaign and advertiser ids are nulled with this probability
    # (category, brand and the outcome fields stay). On the demo world a model otherwise memorises ids
    # before it learns to match a candidate against the history, and its out-of-time AUC falls after a
    # few epochs (benchmarks/RESULTS.md, "The teacher").
    id_dropout: float = 0.0
    input_gate: bool = True      # CADET self-gate before attention
    qk_gate: bool = True         # CADET gates on projected Q and K
    qk_norm: bool = True         # TM20K: QK-norm, needed for late-training stability
    n_buckets: int = 2           # CADET: K=2 position buckets (slots 1-4, 5+)
    n_click_types: int = 4       # none + view_details / add_to_cart / follow
    aux_click_type_weight: float = 0.1  # ours: CADET gives no weights for aux heads
    aux_dwell_weight: float = 0.1       # ours
    attn_backend: str = "auto"   # one of contracts.ATTENTION_BACKENDS
    attn_chunk: int = 128        # query chunk of the torch reference


@dataclass
class TeacherConfig:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    rope: RoPEConfig = field(default_factory=RoPEConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    max_len: int = 4096          # CADET: sequence length 4096 (configurable up to 20K, TM20K)
    # ours: the targets' cross features count the sample's newest counter_len events (0: every one), not only
    # the events whose tokens fit max_len; None: the kept tokens (ModelSizes.counter_events says why)
    counter_len: int | None = None


@dataclass
class StudentConfig:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    # TM20K: teacher and student share the architecture; the student differs by its tokens
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    rope: RoPEConfig = field(default_factory=RoPEConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    max_len: int = 4096            # history events kept (newest)
    # ours: the candidates' cross features count the newest counter_len events of the user's log (0: every
    # one), the online store's whole log, not only the max_len the graph sees; None: the history tokens' events
    # (a checkpoint from before the field counts as it was trained). ModelSizes.counter_events says why.
    counter_len: int | None = None
    litm: bool = True
    litm_T: int = 3                # TM20K: LITM max index gap T=3
    patm: bool = True
    # TM20K: segments [1,1000],[1001,5000],[5001,10000],[10001,20000] of a 20K history with
    # factors [1,2,3,4]; stored as fractions of max_len (newest first) so they scale.
    patm_bounds: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    patm_factors: tuple[int, ...] = (1, 2, 3, 4)
    lptm: bool = True
    lptm_every: int = 2            # TM20K: pair-sum every 2 layers (of a 6-layer model)
    # TM20K: CE + 50 x KD on the distill head. KD is the Bernoulli KL(teacher || student): its gradient on the
    # distill logit, lambda x (p_s - p_t) ~ lambda x p(1-p) x (z_s - z_t), scales with p(1-p) as the label term's
    # E|p - y| = 2p(1-p) does, so their ratio does not depend on the base rate and lambda needs no CTR scaling.
    kd_lambda: float = 50.0
    kd_temperature: float = 1.0    # ours (Hinton et al.'s T on logits, T^2-scaled); 1 = TM20K's plain KD


@dataclass
class TrainConfig:
    lr: float = 1e-3              # ours
    weight_decay: float = 0.01    # ours
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0        # ours
    token_budget: int = 16384     # tokens per (per-rank) packed batch; CADET: fixed token budget
    # Passes: at most `epochs`. With a held-out slice (`holdout`), the pass is chosen by the data: after every
    # pass the slice is scored, training stops after `patience` passes without a better AUC and the best pass's
    # weights are kept (fit); without one, exactly `epochs` passes.
    epochs: int = 1
    patience: int = 2             # ours: passes without a better held-out AUC before stopping
    # ours: share of the newest day's target impressions (its latest, by time) held out of training by
    # train_teacher / train_student to choose the pass and fit the per-bucket calibration (data.time_holdout);
    # 0 trains on everything for `epochs` passes, uncalibrated
    holdout: float = 0.0
    max_steps: int | None = None
    seed: int = 0
    shuffle_buffer: int = 256     # samples held for the streaming shuffle
    log_every: int = 10
    ckpt_every: int = 100
    warmup_steps: int = 20
    amp_bf16: bool = True         # bf16 autocast, CUDA only
    device: str | None = None     # None = cuda if available else cpu
    progress: bool = False        # tqdm bar (log lines are always emitted)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


# What a field added later means in a config saved before it existed: the behaviour that config was trained
# with (a registered model keeps scoring as it was exported).
SAVED_BEFORE = {FeatureConfig: {"item_stats": False}}


def _build(cls, d):
    kwargs = {k: v for k, v in SAVED_BEFORE.get(cls, {}).items() if k not in d}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    sub = {"features": FeatureConfig, "backbone": BackboneConfig, "rope": RoPEConfig, "mask": MaskConfig}
    for k, v in d.items():
        if k not in hints:
            continue
        if k in sub and isinstance(v, dict):
            v = _build(sub[k], v)
        elif isinstance(v, list):
            v = tuple(v)
        kwargs[k] = v
    return cls(**kwargs)


def from_dict(cls, d: dict):
    return _build(cls, d)


@dataclass(frozen=True)
class ModelSizes:
    """The sizes and training settings of the models the pipeline trains and serves, sized for a 2-core CPU
    (the seeds' full sizes are the other configs' defaults). ``DEMO_SIZES`` is what the pipeline runs (its
    Dagster run configuration defaults to it) and what ``preset("demo")`` builds."""

    d_model: int = 64
    teacher_layers: int = 4       # the teacher is the larger model (TM20K); 2 layers left it 0.02-0.04 AUC lower on demo
    student_layers: int = 2
    n_heads: int = 2
    # The student's history: its newest 1,024 events, merged LITM -> PATM (StudentConfig.max_len). The teacher's
    # context is derived from it (teacher_tokens), so it always sees every event the student sees.
    student_events: int = 1024
    # The user's log both models' cross features count (TeacherConfig / StudentConfig.counter_len) and the online
    # store keeps: CADET's 4,096-event sequence. Counting over the student's 1,024 events instead cut the
    # 30-day counters of heavy users (36 % of the demo world's test impressions) and cost an MLP on the counters
    # 0.019 AUC there (benchmarks/RESULTS.md, "The counters"); a longer graph would cost serving latency.
    counter_events: int = 4096
    item_buckets: int = 1 << 15
    # Passes: at most `epochs`; the newest day's latest `holdout` share of impressions picks how many (stop after
    # `patience` without a better AUC there, keep the best pass) and fits the served head's per-bucket
    # calibration (TrainConfig.holdout / patience; the same code path as benchmarks/quality_suite).
    epochs: int = 12
    patience: int = 2
    holdout: float = 0.2
    max_steps: int = 800          # caps a day's training on large worlds
    token_budget: int = 2048      # small packed batches: more optimizer steps per day of data
    lr: float = 3e-3
    # BackboneConfig.id_dropout. Trained on demo days 1-5, both models memorise ids after their best pass; with
    # 0.5 the student holds 0.82-0.83 on days 6-8 by pass 6 where it fell to 0.76-0.78 without it, at the same
    # peak (benchmarks/RESULTS.md, "The teacher"). The daily student passes over every new day, so it drifts less.
    id_dropout: float = 0.5
    seed: int = 0
    ckpt_every: int = 50          # steps between resumable checkpoints

    @property
    def teacher_tokens(self) -> int:
        """The teacher's context (TeacherConfig.max_len), in tokens: teacher_context(student_events)."""
        return teacher_context(self.student_events)


def teacher_context(student_events: int) -> int:
    """The tokens a teacher needs to see every event a student of ``student_events`` history events sees, in
    the same user-day (models.data.teacher_tokens / student_tokens): 4 x student_events.

    The student keeps the sample's newest student_events events. The teacher spends 2 tokens on an impression
    and 1 on a behavior, keeps every target and drops the oldest other events until it fits. A sequence holds
    at most max_len // 4 targets (data.PackedLoader), at most max_len / 2 tokens, which leaves the other
    events at least max_len / 2 = 2 x student_events tokens: the student's newest events, even if every
    one is an impression. What the teacher sees beyond them (CADET's 4,096-token sequence for a 1,024-event
    student), unmerged and in more layers, is what it knows that the student does not."""
    return 4 * student_events


DEMO_SIZES = ModelSizes()
# What the pipeline trains each model with where it departs from DEMO_SIZES (the defaults of
# assets/training.py's TeacherTrainingConfig and StudentTrainingConfig): the teacher's window of days takes
# larger batches, and the daily student, warm-started, a smaller step.
DEMO_TEACHER_SIZES = dataclasses.replace(DEMO_SIZES, token_budget=4096)
DEMO_STUDENT_SIZES = dataclasses.replace(DEMO_SIZES, lr=2e-3)


def feature_config(sizes: ModelSizes) -> FeatureConfig:
    """The hashed-id table sizes of the models ``sizes`` describes."""
    return FeatureConfig(item_buckets=sizes.item_buckets, campaign_buckets=1 << 12, advertiser_buckets=1 << 11,
                         category_buckets=1 << 10, brand_buckets=1 << 12)


def _backbone(sizes: ModelSizes, n_layers: int) -> BackboneConfig:
    return BackboneConfig(d_model=sizes.d_model, n_layers=n_layers, n_heads=sizes.n_heads, id_dropout=sizes.id_dropout)


def teacher_config(sizes: ModelSizes) -> TeacherConfig:
    return TeacherConfig(features=feature_config(sizes), max_len=sizes.teacher_tokens,
                         counter_len=sizes.counter_events, backbone=_backbone(sizes, sizes.teacher_layers))


def student_config(sizes: ModelSizes) -> StudentConfig:
    # Every merge the student is configured with acts in it. TM20K's LPTM merges before every lptm_every-th
    # layer; a student with no such layer (2 layers, lptm_every 2) carries no LPTM rather than a switch
    # that does nothing (Student.merge_layers).
    return StudentConfig(features=feature_config(sizes), max_len=sizes.student_events,
                         counter_len=sizes.counter_events, backbone=_backbone(sizes, sizes.student_layers),
                         lptm=sizes.student_layers > StudentConfig.lptm_every)


def train_config(sizes: ModelSizes) -> TrainConfig:
    return TrainConfig(lr=sizes.lr, epochs=sizes.epochs, patience=sizes.patience, holdout=sizes.holdout,
                       max_steps=sizes.max_steps, token_budget=sizes.token_budget, seed=sizes.seed, warmup_steps=5,
                       log_every=1000, ckpt_every=sizes.ckpt_every)


def preset(name: str) -> tuple[TeacherConfig, StudentConfig, TrainConfig]:
    """(teacher, student, train) configs sized for the simulator presets.

    tiny  - tests and smoke runs (seconds on one CPU thread)
    demo  - the models the pipeline trains and serves (DEMO_SIZES; minutes on 2 CPU cores), with the daily
            student's training settings (DEMO_STUDENT_SIZES; the teacher's are DEMO_TEACHER_SIZES)
    large - the seeds' sizes (CADET backbone 352 x 8 layers, 4K teacher context), for a GPU
    """
    if name == "large":
        return TeacherConfig(), StudentConfig(), TrainConfig()
    if name == "demo":
        return teacher_config(DEMO_SIZES), student_config(DEMO_SIZES), train_config(DEMO_STUDENT_SIZES)
    if name == "tiny":
        fc = FeatureConfig(item_buckets=1 << 12, campaign_buckets=512, advertiser_buckets=256, category_buckets=128,
                           brand_buckets=256, surface_buckets=16, device_buckets=16)
        bb = BackboneConfig(d_model=32, n_layers=2, n_heads=2)
        tr = TrainConfig(lr=3e-3, weight_decay=0.1, token_budget=4096, warmup_steps=10, log_every=10, ckpt_every=100)
        return (TeacherConfig(features=fc, backbone=bb, max_len=teacher_context(256)),
                StudentConfig(features=fc, backbone=dataclasses.replace(bb), max_len=256, lptm=False), tr)
    raise ValueError(f"unknown preset {name!r} (tiny, demo, large)")
