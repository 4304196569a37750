"""Packed jagged batches: tokenised samples packed greedily up to a fixed token budget (no padding;
offsets), a deterministic shuffle (file order by seed+epoch, then a seeded shuffle buffer), and the
balanced split of a global batch across DDP ranks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from .samples import Sample, TeacherProbs, iter_samples, list_sample_files, split_by_targets
from .student_tokens import StudentTokens, student_tokens
from .teacher_tokens import TeacherTokens, teacher_tokens
from .tokens import Targets

@dataclass
class Batch:
    kind: str                                  # "teacher" | "student"
    targets: Targets
    n_events: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, device) -> "Batch":
        return Batch(self.kind, self.targets, self.n_events, {k: v.to(device, non_blocking=True) for k, v in self.tensors.items()})

    @property
    def n_tokens(self) -> int:
        t = self.tensors
        return int(t["offsets"][-1]) if self.kind == "teacher" else int(t["hist_len"].sum() + t["cand_len"].sum())

    def target_tensors(self, device) -> dict[str, torch.Tensor]:
        tg = self.targets
        return dict(bucket=torch.as_tensor(tg.bucket, device=device), label=torch.as_tensor(tg.label, dtype=torch.float32, device=device),
                    click_type=torch.as_tensor(tg.click_type, device=device),
                    log_dwell=torch.as_tensor(tg.log_dwell, dtype=torch.float32, device=device),
                    teacher_p=torch.as_tensor(tg.teacher_p, dtype=torch.float32, device=device))


def collate_teacher(toks: list[TeacherTokens]) -> Batch:
    lens = np.array([t.n_tokens for t in toks], np.int64)
    offsets = np.r_[0, np.cumsum(lens)]
    tens = dict(feats=torch.from_numpy(np.concatenate([t.feats for t in toks])),
                ts=torch.from_numpy(np.concatenate([t.ts for t in toks])),
                is_target=torch.from_numpy(np.concatenate([t.is_target for t in toks])),
                cross=torch.from_numpy(np.concatenate([t.cross for t in toks])),
                offsets=torch.from_numpy(offsets))
    return Batch("teacher", Targets.cat([t.targets for t in toks]), int(sum(t.n_events for t in toks)), tens)


def collate_student(toks: list[StudentTokens]) -> Batch:
    hl = np.array([t.n_groups for t in toks], np.int64)
    goff = np.r_[0, np.cumsum(hl)[:-1]]
    tens = dict(ev_feats=torch.from_numpy(np.concatenate([t.ev_feats for t in toks])),
                ev_group=torch.from_numpy(np.concatenate([t.ev_group + o for t, o in zip(toks, goff)])),
                hist_ts=torch.from_numpy(np.concatenate([t.hist_ts for t in toks])),
                hist_len=torch.from_numpy(hl),
                cand_feats=torch.from_numpy(np.concatenate([t.cand_feats for t in toks])),
                cand_ts=torch.from_numpy(np.concatenate([t.cand_ts for t in toks])),
                cand_cross=torch.from_numpy(np.concatenate([t.cand_cross for t in toks])),
                cand_len=torch.from_numpy(np.array([len(t.cand_ts) for t in toks], np.int64)),
                ev_len=torch.from_numpy(np.array([t.n_events for t in toks], np.int64)))
    return Batch("student", Targets.cat([t.targets for t in toks]), int(sum(t.n_events for t in toks)), tens)


def collate(toks: list) -> Batch:
    return collate_teacher(toks) if isinstance(toks[0], TeacherTokens) else collate_student(toks)


def tokenizer_for(kind: str, cfg):
    """Sample -> tokens for a TeacherConfig / StudentConfig, with max_tokens = the budget."""
    fc = cfg.features
    if kind == "teacher":
        return lambda s, budget: teacher_tokens(s, fc, min(cfg.max_len, budget), cfg.mask.delay_ms, cfg.counter_len)

    def student(s: Sample, budget: int) -> StudentTokens:
        return student_tokens(s, fc, cfg.max_len, cfg.litm, cfg.litm_T, cfg.patm, cfg.patm_bounds, cfg.patm_factors,
                              max_tokens=budget, delay_ms=cfg.mask.delay_ms, counter_len=cfg.counter_len)
    return student


def split_for_ranks(toks: list, world: int) -> list[list]:
    """Deterministic balanced split of a global batch across ranks (largest first, greedy)."""
    parts: list[list] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(toks)), key=lambda i: (-toks[i].n_tokens, i)):
        r = min(range(world), key=lambda r: (load[r], r))
        parts[r].append(i)
        load[r] += toks[i].n_tokens
    return [[toks[i] for i in sorted(p)] for p in parts]


class PackedLoader:
    """Global batches of tokenised samples with at most `token_budget * world` tokens
    (each rank's share <= about token_budget after split_for_ranks). Deterministic per (seed, epoch).
    A sample is cut and split by the global budget, so N ranks of budget B/N read the batches one
    process of budget B reads (models.distributed)."""

    def __init__(self, paths, kind: str, cfg, token_budget: int, seed: int | None = 0, shuffle_buffer: int = 256,
                 teacher_probs=None, world: int = 1, targets_only: bool = True, tokenizer=None):
        self.paths = list_sample_files(paths)
        self.kind, self.cfg, self.budget = kind, cfg, int(token_budget)
        self.seed, self.shuffle_buffer, self.world = seed, shuffle_buffer, world
        self.teacher = TeacherProbs(teacher_probs) if teacher_probs is not None else None
        self.tok = tokenizer or tokenizer_for(kind, cfg)   # a model's own (RankingBackbone.tokenizer)
        self.targets_only = targets_only
        self.sample_budget = self.budget * world
        if kind == "teacher" and cfg.max_len > self.sample_budget:
            # the budget would cut every sequence below the teacher's context, and with it what the teacher
            # sees of the student's events (models.config.teacher_context)
            raise ValueError(f"a teacher batch of {self.sample_budget} tokens cannot hold the teacher's "
                             f"{cfg.max_len}-token context: raise the token budget to at least {cfg.max_len}")
        # at most half of a sequence's token room goes to targets (a teacher target costs 2 tokens)
        room = cfg.max_len if kind == "teacher" else self.sample_budget
        self.max_targets = max(1, room // 4)

    def __iter__(self):
        return self.iter_epoch(0)

    def iter_epoch(self, epoch: int = 0) -> Iterator[list]:
        cap = self.budget * self.world
        cur, used = [], 0
        samples = iter_samples(self.paths, self.cfg.features, self.teacher, self.seed, epoch, self.shuffle_buffer)
        for s in (part for sample in samples for part in split_by_targets(sample, self.max_targets)):
            t = self.tok(s, self.sample_budget)
            if self.targets_only and len(t.targets.label) == 0:
                continue
            if cur and used + t.n_tokens > cap:
                yield cur
                cur, used = [], 0
            cur.append(t)
            used += t.n_tokens
        if cur:
            yield cur
