"""The student's ablations that change what it sees, kept here so the served modules never branch on them: each
is a StudentConfig subclass (its extra settings) whose ``build()`` gives a Student subclass (what it does
differently, through Student's own hooks: ``tokenizer`` and ``forward``). ``fit_model`` (protocol.py) trains
them through models.fit_with_holdout, the loop train_student runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from models.config import StudentConfig
from models.data import F_POS, Batch, Sample, StudentTokens
from models.data.tokens import valid_targets
from models.layers import init_weights
from models.student import Student


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


ABLATED = (NoHistoryConfig, PositionInputConfig, DeepAdapterConfig)


def ablated(base: StudentConfig, kind: type, **settings) -> StudentConfig:
    """``base`` as the ablation ``kind`` (one of ABLATED), with its own settings (or other values of base's)."""
    return kind(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **settings})
