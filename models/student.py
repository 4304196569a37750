"""Student (served): TM20K token merging + dual-head distillation, MTGR/CADET candidate scoring.

Input side (data.student_tokens): LITM then PATM groups of history events; here the group
embedding is the sum of its members' embeddings (mass preserved). Packed layout per sample:
[history groups | candidates]. History rows are causal; candidate rows see the history visible
at their request time (t_req - delay) and themselves, never each other (masks.candidate_bounds).
LPTM: before every `lptm_every`-th layer, adjacent history tokens are pair-summed (oldest first,
an odd newest token stays alone); candidates are never merged; bounds are rebuilt after every merge.

Heads: `logits` = main tower, trained on labels only, this is what serves; `distill_logits` =
distill tower, trained on CE + kd_lambda x KD against the teacher's probability.

The quality report's ablations of it (no history, position as input) are subclasses in
benchmarks/quality_suite/ablations.py; nothing here branches on them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backbone import RankingBackbone
from .config import StudentConfig
from .data import Batch
from .layers import gather_bucket, label_loss_sums, rope_positions
from .masks import candidate_bounds, lengths_to_offsets, seq_index


def pair_merge(x: torch.Tensor, ts: torch.Tensor, lens: torch.Tensor):
    """LPTM: sum tokens (2i, 2i+1) of every sequence's history. Returns (x, ts, lens)."""
    off = lengths_to_offsets(lens)
    seq = seq_index(off)
    p = torch.arange(x.shape[0], device=x.device) - off[seq]
    new_lens = (lens + 1) // 2
    new_off = lengths_to_offsets(new_lens)
    dst = new_off[seq] + p // 2
    G = int(new_off[-1])
    xn = torch.zeros(G, x.shape[1], dtype=x.dtype, device=x.device).index_add(0, dst, x)
    tn = torch.full((G,), torch.iinfo(torch.long).min, dtype=torch.long, device=x.device).scatter_reduce(
        0, dst, ts, "amax", include_self=True)
    return xn, tn, new_lens


class Student(RankingBackbone):
    kind = "student"

    def __init__(self, cfg: StudentConfig):
        super().__init__(cfg, bucket_heads=("main_head", "distill_head"))
        self.last_lengths: list[int] = []  # history tokens per stage (diagnostics)

    def merge_layers(self) -> set[int]:
        if not self.cfg.lptm or self.cfg.lptm_every <= 0:
            return set()
        return {i for i in range(1, len(self.blocks)) if i % self.cfg.lptm_every == 0}

    def embed_history(self, batch: Batch) -> torch.Tensor:
        t = batch.tensors
        e = self.embed(t["ev_feats"])
        G = int(t["hist_len"].sum())
        return torch.zeros(G, e.shape[1], dtype=e.dtype, device=e.device).index_add(0, t["ev_group"], e)

    def embed_candidates(self, feats: torch.Tensor, cross: torch.Tensor) -> torch.Tensor:
        x = self.embed(feats)
        return x if self.cross is None else x + self.cross(cross).to(x.dtype)

    def forward(self, batch: Batch, serving: bool = True) -> dict[str, torch.Tensor]:
        t = batch.tensors
        m = self.cfg.mask
        xh = self.embed_history(batch)
        xc = self.embed_candidates(t["cand_feats"], t["cand_cross"])
        hts, hlen, clen, cts = t["hist_ts"], t["hist_len"], t["cand_len"], t["cand_ts"]
        cut = cts - self.delay_ms(serving)
        merges = self.merge_layers()
        self.last_lengths = []
        x = None
        for i, blk in enumerate(self.blocks):
            if x is None or i in merges:
                if x is not None:
                    xh, xc = x[hpos], x[cpos]
                    xh, hts, hlen = pair_merge(xh, hts, hlen)
                off, hpos, cpos, lo, hi = candidate_bounds(hlen, hts, clen, cut, m.window, m.n_global)
                T = int(off[-1])
                x = torch.empty(T, xh.shape[1], dtype=xh.dtype, device=xh.device)
                x = x.index_copy(0, hpos, xh).index_copy(0, cpos, xc)
                ts = torch.empty(T, dtype=torch.long, device=xh.device).index_copy(0, hpos, hts).index_copy(0, cpos, cts)
                cs = self.rope.angles(rope_positions(self.cfg.rope, ts, off))
                self.last_lengths.append(int(hlen.sum()))
            x = blk(x, lo, hi, cs)
        h = x[cpos]
        out = {"logits": self.main_head(h)}
        if not serving:
            out["distill_logits"] = self.distill_head(h)
            out["click_type"], out["dwell"] = self.aux(h)
        return out

    def loss_sums(self, out, tg) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        labels = label_loss_sums(out, tg, self.cfg.backbone)
        if "distill_logits" not in out:
            return labels
        res = {"ctr": labels.pop("ctr"),
               "ctr_distill": label_loss_sums({"logits": out["distill_logits"]}, tg, self.cfg.backbone)["ctr"]}
        p_t = tg["teacher_p"]
        has = ~torch.isnan(p_t)
        T = float(self.cfg.kd_temperature)
        z = gather_bucket(out["distill_logits"], tg["bucket"]).float()[has] / T
        pt = torch.sigmoid(torch.logit(p_t[has].clamp(1e-6, 1 - 1e-6)) / T).clamp(1e-6, 1 - 1e-6)
        # KD = KL(teacher || student) for a Bernoulli = soft-label BCE minus the teacher's entropy, on logits
        # divided by T and scaled by T^2 (Hinton et al.) so its gradient keeps its size
        kd = (F.binary_cross_entropy_with_logits(z, pt, reduction="sum")
              - F.binary_cross_entropy(pt, pt, reduction="sum")) * T * T
        res["kd"] = (kd, has.sum().float(), float(self.cfg.kd_lambda))
        return res | labels
