"""What the teacher and the student are built of alike: token and cross-feature embeddings, the stack of
gated blocks, time RoPE, position-bucket heads (one tower for the teacher, two for the student) and the
training-only auxiliary heads; and the delay their masks apply."""
from __future__ import annotations

import torch.nn as nn

from .data import tokenizer_for
from .layers import AuxHeads, Block, BucketHeads, CrossFeatures, RoPE, TokenEmbedding, init_weights


class RankingBackbone(nn.Module):
    def __init__(self, cfg, bucket_heads: tuple[str, ...]):
        """``cfg``: a TeacherConfig or StudentConfig. ``bucket_heads``: the attribute names of the model's
        BucketHeads towers, built in this order after the RoPE and before the auxiliary heads: the order in
        which the modules draw their initial weights, which a seed reproduces."""
        super().__init__()
        self.cfg = cfg
        b = cfg.backbone
        self.embed = TokenEmbedding(cfg.features, b.d_model, b.id_dropout)
        self.cross = CrossFeatures.maybe(cfg.features, b.d_model)
        self.blocks = nn.ModuleList([Block(b) for _ in range(b.n_layers)])
        self.rope = RoPE(cfg.rope, b.d_model // b.n_heads)
        for name in bucket_heads:
            setattr(self, name, BucketHeads(b.d_model, b.n_buckets))
        self.aux = AuxHeads(b.d_model, b.n_click_types)
        init_weights(self)

    def tokenizer(self):
        """Sample -> tokens for this model (fit and predict read through it): the kind's own tokens."""
        return tokenizer_for(self.kind, self.cfg)

    def delay_ms(self, serving: bool) -> int:
        """The delay mask's width: always at serving; in training unless the config trains without it."""
        m = self.cfg.mask
        return int(m.delay_ms) if (serving or m.train_delay) else 0
