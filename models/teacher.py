"""Teacher: CADET-style decoder over interleaved (content, action) tokens (full history)."""
from __future__ import annotations

import torch

from .backbone import RankingBackbone
from .config import TeacherConfig
from .data import Batch
from .layers import label_loss_sums, rope_positions
from .masks import teacher_bounds


class Teacher(RankingBackbone):
    kind = "teacher"

    def __init__(self, cfg: TeacherConfig):
        super().__init__(cfg, bucket_heads=("heads",))

    def bounds(self, batch: Batch, serving: bool):
        t = batch.tensors
        m = self.cfg.mask
        return teacher_bounds(t["offsets"], t["ts"], t["is_target"], self.delay_ms(serving), m.window, m.n_global)

    def forward(self, batch: Batch, serving: bool = True) -> dict[str, torch.Tensor]:
        t = batch.tensors
        x = self.contextualise(self.embed_tokens(t), *self.bounds(batch, serving), t)
        h = x[t["is_target"]]
        out = {"logits": self.heads(h)}
        if not serving:
            out["click_type"], out["dwell"] = self.aux(h)
        return out

    def embed_tokens(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """The tokens' embeddings, with the targets' cross features added: the hook through which the quality report's
        teacher variants (benchmarks/quality_suite/ablations.py) add to the targets, as Student.embed_candidates."""
        x = self.embed(t["feats"])
        if self.cross is None:
            return x
        return x.index_add(0, torch.nonzero(t["is_target"]).squeeze(1), self.cross(t["cross"]).to(x.dtype))

    def contextualise(self, x, lo, hi, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """The token stack: each token attends its [lo, hi) interval, positioned by time RoPE. The hook through which
        the quality report's HSTU-style ranker (benchmarks/quality_suite/hstu.py) swaps the layer, nothing else."""
        cs = self.rope.angles(rope_positions(self.cfg.rope, t["ts"], t["offsets"]))
        for blk in self.blocks:
            x = blk(x, lo, hi, cs)
        return x

    def loss_sums(self, out, tg) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        return label_loss_sums(out, tg, self.cfg.backbone)
