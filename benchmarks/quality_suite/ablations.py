"""The student's ablations that change what it sees, kept here so the served modules never branch on them: each
is a StudentConfig subclass (its extra settings) whose ``build()`` gives a Student subclass (what it does
differently, through Student's own hooks: ``tokenizer`` and ``forward``). ``fit_model`` (protocol.py) trains
them through models.fit_with_holdout, the loop train_student runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn
from torch.nn.functional import softplus

from models.config import StudentConfig, TeacherConfig
from models.data import CROSS_ACTIONS, F_ACTION, F_BRAND, F_CAT, F_POS, N_ACTIONS, Batch, Sample, StudentTokens
from models.data.tokens import valid_targets
from models.layers import init_weights
from models.masks import lengths_to_offsets, seq_index, visible_count
from models.student import Student
from models.teacher import Teacher


def _no_history(t: StudentTokens, keep_counters: bool) -> StudentTokens:
    """The same candidates with no history tokens, and no cross counts unless ``keep_counters``."""
    F = t.ev_feats.shape[1]
    empty = np.zeros(0, np.int64)
    return dataclasses.replace(t, ev_feats=np.zeros((0, F), np.int64), ev_ts=empty, ev_group=empty, hist_ts=empty,
                               n_events=0, cand_cross=t.cand_cross if keep_counters else np.zeros_like(t.cand_cross))


def _with_positions(t: StudentTokens, s: Sample, max_position: int) -> StudentTokens:
    """Each candidate's real position in its F_POS column. The candidates of student_tokens are the sample's
    valid targets, the newest ones if cut."""
    idx = np.flatnonzero(valid_targets(s))
    idx = idx[len(idx) - len(t.cand_ts):]
    assert np.array_equal(s.impression_id[idx], t.targets.impression_id), "candidates are not the sample's targets"
    feats = t.cand_feats.copy()
    feats[:, F_POS] = np.clip(s.position[idx], 0, max_position)
    return dataclasses.replace(t, cand_feats=feats)


def _replace_tensors(batch: Batch, n_events: int | None = None, **tensors) -> Batch:
    return Batch(batch.kind, batch.targets, batch.n_events if n_events is None else n_events,
                 {**batch.tensors, **tensors})


@dataclasses.dataclass
class NoHistoryConfig(StudentConfig):
    """The no-history baseline (a DLRM-like model: candidate features only, no user sequence). Not max_len=0,
    which means "every event". ``keep_counters``: keep the candidates' cross features (the counters of the
    user's log), a DLRM on MTGR's counters, the industrial ranker before sequence models."""
    keep_counters: bool = False

    def build(self) -> Student:
        return NoHistoryStudent(self)


class NoHistoryStudent(Student):
    """Tokens without history, and whatever history a batch holds is dropped."""

    def tokenizer(self):
        tokens = super().tokenizer()
        return lambda s, budget: _no_history(tokens(s, budget), self.cfg.keep_counters)

    def forward(self, batch: Batch, serving: bool = True):
        t = batch.tensors
        return super().forward(_replace_tensors(batch, 0, ev_feats=t["ev_feats"][:0], ev_group=t["ev_group"][:0],
                                                hist_ts=t["hist_ts"][:0], hist_len=torch.zeros_like(t["hist_len"])),
                               serving)


@dataclasses.dataclass
class PositionInputConfig(StudentConfig):
    """CADET's "common practice" baseline instead of its position heads: the scored impression's real position
    is an input of its candidate token in training (through the position embedding the history's impressions
    use), and ``serving_position`` fills it at serving and evaluation, when the slot is not yet known. Pair it
    with backbone.n_buckets=1 for CADET's single-head baseline."""
    serving_position: int = 1      # ours: CADET names no default slot; 1 = the top slot

    def build(self) -> Student:
        return PositionInputStudent(self)


class PositionInputStudent(Student):
    def tokenizer(self):
        tokens, max_position = super().tokenizer(), self.cfg.features.max_position
        return lambda s, budget: _with_positions(tokens(s, budget), s, max_position)

    def forward(self, batch: Batch, serving: bool = True):
        if serving:
            feats = batch.tensors["cand_feats"].clone()
            feats[:, F_POS] = min(int(self.cfg.serving_position), self.cfg.features.max_position)
            batch = _replace_tensors(batch, cand_feats=feats)
        return super().forward(batch, serving)


@dataclasses.dataclass
class DeepAdapterConfig(StudentConfig):
    """The counters' adapter (models.layers.CrossFeatures) with two hidden layers instead of one: the shape of
    benchmarks/counter_probe.py's MLP, which scores above the student on the counters alone."""

    def build(self) -> Student:
        return DeepAdapterStudent(self)


class DeepAdapterStudent(Student):
    def __init__(self, cfg: DeepAdapterConfig):
        super().__init__(cfg)
        d, n = cfg.backbone.d_model, self.cross.net[0].in_features
        self.cross.net = nn.Sequential(nn.Linear(n, d), nn.SiLU(), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        init_weights(self.cross)


@dataclasses.dataclass
class LearnedCountsSettings:
    """Counters whose match is learnt (issue #33's sequence effects): the 48 counters count the user's events of the
    candidate's own item, category or brand, so an event of another category that leads to the candidate's (the
    simulator's complement term) or the order of a brand's carts and buys (its abandonment term) is in none of them.
    Per candidate and head h, over its visible history events e (the student's own, before merging):

        category heads: log1p(sum_e exp(-age_e / tau_h) * softplus(scale * <U_h[cat_cand], V_h[cat_e]> + b_h))
        brand heads:    sum_e [brand_e == brand_cand] * exp(-age_e / tau_h) * w_h[action_e]

    a DIN-style target attention without the softmax (DIN keeps the weights unnormalised so that how much of the
    history matches can show), U, V of rank ``rank`` (the relation between categories is learnt, not assumed to be
    equality), signed per-action weights w (a cart and a later buy can cancel), decays tau_h per head from an hour to
    a month. The features enter the candidate's (the teacher's target's) token through a zero-initialised adapter, as
    the counters do."""
    learned_heads: int = 8
    learned_rank: int = 16
    # U starts at 0; the scale lets Adam's per-step moves (~lr) reach a relation within the recipe's passes. 20, not 5:
    # chosen on the `sequence` world's test day (epoch_curve-style probe, RESULTS.md "What the sequence effects are
    # worth"), so that world does not judge it
    learned_scale: float = 20.0
    learned_tau_hours: tuple[float, ...] = (1.0, 6.0, 24.0, 24.0, 72.0, 72.0, 240.0, 720.0)


@dataclasses.dataclass
class LearnedCountsConfig(StudentConfig, LearnedCountsSettings):
    """The student with LearnedCounts over its own history events (before merging)."""

    def build(self) -> Student:
        return LearnedCountsStudent(self)


@dataclasses.dataclass
class LearnedCountsTeacherConfig(TeacherConfig, LearnedCountsSettings):
    """The teacher with LearnedCounts over its tokens' outcomes: the same counts over its longer, unmerged log, a
    path the served student lacks (issue #33's teacher that sees more)."""

    def build(self) -> Teacher:
        return LearnedCountsTeacher(self)


class LearnedCounts(nn.Module):
    def __init__(self, cfg: LearnedCountsSettings):
        super().__init__()
        h, r, d, fc = cfg.learned_heads, cfg.learned_rank, cfg.backbone.d_model, cfg.features
        assert len(cfg.learned_tau_hours) == h
        self.h, self.r, self.scale = h, r, cfg.learned_scale
        self.u = nn.Embedding(fc.category_buckets, h * r)
        self.v = nn.Embedding(fc.category_buckets, h * r)
        self.b = nn.Parameter(torch.zeros(h))
        self.log_tau = nn.Parameter(torch.log(torch.tensor(cfg.learned_tau_hours)))
        self.brand_action = nn.Parameter(torch.zeros(h, N_ACTIONS))
        self.out = nn.Sequential(nn.Linear(2 * h, d), nn.SiLU(), nn.Linear(d, d))
        init_weights(self)
        nn.init.zeros_(self.u.weight)
        nn.init.normal_(self.v.weight, std=0.3)
        nn.init.zeros_(self.out[-1].weight)

    def forward(self, batch: Batch, delay_ms: int) -> torch.Tensor:
        """(scored tokens, d): what the student's candidates or the teacher's targets gain, with nothing newer than
        their time minus ``delay_ms``."""
        if batch.kind == "student":
            return self.out(self.student_counts(batch, batch.tensors["cand_ts"] - delay_ms))
        return self.out(self.teacher_counts(batch, delay_ms))

    def student_counts(self, batch: Batch, cut: torch.Tensor) -> torch.Tensor:
        """(candidates, 2 x heads). An event counts for a candidate when its group does in
        the attention: the group's newest time at or before the candidate's cut (models.masks.visible_count). One
        sequence at a time: a candidate only ever counts its own user's events, and a packed batch of many users
        as one (candidates x events) block grew past 15 GB at the evaluation's token budget."""
        t = batch.tensors
        hoff, coff = lengths_to_offsets(t["hist_len"]), lengths_to_offsets(t["cand_len"])
        n_visible = visible_count(hoff, t["hist_ts"], seq_index(coff), cut)     # groups, per candidate
        group = t["ev_group"]
        eseq = seq_index(hoff)[group]
        eoff = lengths_to_offsets(torch.bincount(eseq, minlength=len(t["hist_len"])))
        pos, ev_ts = group - hoff[eseq], t["hist_ts"][group]
        parts = [torch.zeros(0, 2 * self.h)]
        for s in range(len(t["cand_len"])):
            c, e = slice(int(coff[s]), int(coff[s + 1])), slice(int(eoff[s]), int(eoff[s + 1]))
            if c.stop > c.start:
                parts.append(self.counts(t["cand_feats"][c], t["cand_ts"][c], t["ev_feats"][e], ev_ts[e],
                                         pos[e][None, :] < n_visible[c][:, None]))
        return torch.cat(parts)

    def teacher_counts(self, batch: Batch, delay_ms: int) -> torch.Tensor:
        """(targets, 2 x heads): each target against its sequence's tokens that carry an outcome (a behaviour, an
        impression's action token: the rows models.data.cross_counts counts), those at or before its time minus the
        delay, as the counters see them."""
        t = batch.tensors
        feats, ts, off = t["feats"], t["ts"], t["offsets"]
        is_event = torch.isin(feats[:, F_ACTION], torch.tensor(CROSS_ACTIONS))
        parts = [torch.zeros(0, 2 * self.h)]
        for s in range(len(off) - 1):
            r = slice(int(off[s]), int(off[s + 1]))
            q, e = t["is_target"][r], is_event[r]
            if q.any():
                cand_ts, ev_ts = ts[r][q], ts[r][e]
                parts.append(self.counts(feats[r][q], cand_ts, feats[r][e], ev_ts,
                                         ev_ts[None, :] <= cand_ts[:, None] - delay_ms))
        return torch.cat(parts)

    def counts(self, cand, cand_ts, ev, ev_ts, vis) -> torch.Tensor:
        """One user's scored tokens against their events, ``vis`` (scored, events) saying which count:
        (scored, 2 x heads)."""
        age_h = (cand_ts[:, None] - ev_ts[None, :]).clamp(min=0).double() / 3.6e6
        decay = torch.exp(-age_h.float()[None] / torch.exp(self.log_tau).view(-1, 1, 1)) * vis[None]
        u = self.u(cand[:, F_CAT]).view(-1, self.h, self.r)
        v = self.v(ev[:, F_CAT]).view(-1, self.h, self.r)
        w = softplus(self.scale * torch.einsum("chr,ehr->hce", u, v) + self.b.view(-1, 1, 1))
        category = torch.log1p((w * decay).sum(-1))
        same_brand = (cand[:, F_BRAND][:, None] == ev[:, F_BRAND][None, :]) & (cand[:, F_BRAND][:, None] > 0)
        brand = (decay * same_brand[None] * self.brand_action[:, ev[:, F_ACTION]][:, None, :]).sum(-1)
        return torch.cat([category, brand]).T


class _WithLearnedCounts:
    """forward: LearnedCounts' gain for the scored tokens, held while the model's own forward embeds them."""

    def forward(self, batch: Batch, serving: bool = True):
        self._gain = self.learned(batch, self.delay_ms(serving))
        try:
            return super().forward(batch, serving)
        finally:
            self._gain = None


class LearnedCountsStudent(_WithLearnedCounts, Student):
    """The student with LearnedCounts added to its candidates' tokens (through Student.embed_candidates)."""

    def __init__(self, cfg: LearnedCountsConfig):
        super().__init__(cfg)
        self.learned, self._gain = LearnedCounts(cfg), None

    def embed_candidates(self, feats, cross):
        x = super().embed_candidates(feats, cross)
        return x + self._gain.to(x.dtype)


class LearnedCountsTeacher(_WithLearnedCounts, Teacher):
    """The teacher with LearnedCounts added to its targets' tokens (through Teacher.embed_tokens)."""

    def __init__(self, cfg: LearnedCountsTeacherConfig):
        super().__init__(cfg)
        self.learned, self._gain = LearnedCounts(cfg), None

    def embed_tokens(self, t):
        x = super().embed_tokens(t)
        return x.index_add(0, torch.nonzero(t["is_target"]).squeeze(1), self._gain.to(x.dtype))


ABLATED = (NoHistoryConfig, PositionInputConfig, DeepAdapterConfig, LearnedCountsConfig)


def ablated(base: StudentConfig, kind: type, **settings) -> StudentConfig:
    """``base`` as the ablation ``kind`` (one of ABLATED), with its own settings (or other values of base's)."""
    return kind(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **settings})
