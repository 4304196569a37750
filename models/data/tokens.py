"""The token layout shared by the teacher's and the student's tokens.

Every token is a row of F=13 integer features summed through one embedding table (layers.TokenEmbedding):
item, campaign, advertiser, category, brand, surface, device, token type, action, position, click type,
dwell bucket, hour of day. Here: the field and token-type ids, each field's vocabulary, the content and
outcome parts of an event's token, and the per-target labels (`Targets`) a batch carries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import FeatureConfig
from .samples import Sample

# token feature columns
F_ITEM, F_CAMPAIGN, F_ADV, F_CAT, F_BRAND, F_SURFACE, F_DEVICE, F_TYPE, F_ACTION, F_POS, F_CTYPE, F_DWELL, F_HOUR = range(13)
N_FIELDS = 13
ID_FIELDS = (F_ITEM, F_CAMPAIGN, F_ADV)  # high-cardinality ids a model can memorise (BackboneConfig.id_dropout)
# token types
TT_IMP_CONTENT, TT_IMP_ACTION, TT_BEHAVIOR, TT_CANDIDATE, TT_IMP_EVENT = 1, 2, 3, 4, 5
N_TOKEN_TYPES = 8
N_ACTIONS = 8
N_HOURS = 25


def field_vocab(fc: FeatureConfig) -> list[int]:
    """Vocabulary size of each of the N_FIELDS token feature columns."""
    return [fc.item_buckets, fc.campaign_buckets, fc.advertiser_buckets, fc.category_buckets, fc.brand_buckets,
            fc.surface_buckets, fc.device_buckets, N_TOKEN_TYPES, N_ACTIONS, fc.max_position + 1, 4,
            fc.dwell_buckets, N_HOURS]


def hour_of_day(ts: np.ndarray) -> np.ndarray:
    return (ts // 3_600_000) % 24 + 1


def dwell_bucket(dwell_ms: np.ndarray, n: int) -> np.ndarray:
    s = np.nan_to_num(dwell_ms / 1000.0, nan=-1.0)
    b = 1 + np.clip(np.floor(np.log2(1.0 + np.maximum(s, 0.0))), 0, n - 2)
    return np.where(s < 0, 0, b).astype(np.int64)


def content_feats(s: Sample, idx: np.ndarray, ttype: int) -> np.ndarray:
    f = np.zeros((len(idx), N_FIELDS), np.int64)
    f[:, :7] = s.ids[idx]
    f[:, F_TYPE] = ttype
    f[:, F_HOUR] = hour_of_day(s.ts[idx])
    return f


def action_feats(s: Sample, idx: np.ndarray, fc: FeatureConfig) -> np.ndarray:
    """Outcome part of an event: action, historical position, click type, dwell bucket."""
    f = np.zeros((len(idx), N_FIELDS), np.int64)
    f[:, F_ACTION] = s.action[idx]
    f[:, F_POS] = np.clip(s.position[idx], 0, fc.max_position)
    f[:, F_CTYPE] = s.click_type[idx]
    f[:, F_DWELL] = dwell_bucket(s.dwell_ms[idx], fc.dwell_buckets)
    f[:, F_HOUR] = hour_of_day(s.ts[idx])
    return f


def event_feats(s: Sample, idx: np.ndarray, ttype: int, fc: FeatureConfig) -> np.ndarray:
    """An event and its outcome in one row (a behaviour token, an impression's action token, a row the cross
    features count): content ids plus the outcome part, the hour of day counted once."""
    return content_feats(s, idx, ttype) + action_feats(s, idx, fc) * (np.arange(N_FIELDS) != F_HOUR)


@dataclass
class Targets:
    """Per target impression (concatenated over a batch)."""

    bucket: np.ndarray
    label: np.ndarray
    click_type: np.ndarray
    log_dwell: np.ndarray     # log1p(dwell seconds), nan if unknown
    teacher_p: np.ndarray
    impression_id: np.ndarray
    user_id: np.ndarray

    @staticmethod
    def of(s: Sample, idx: np.ndarray) -> "Targets":
        return Targets(bucket=np.clip(s.bucket[idx], 0, None), label=np.clip(s.label[idx], 0, 1),
                       click_type=s.click_type[idx], log_dwell=np.log1p(s.dwell_ms[idx] / 1000.0),
                       teacher_p=s.teacher_p[idx], impression_id=s.impression_id[idx],
                       user_id=np.full(len(idx), s.user_id, dtype=object))

    @staticmethod
    def cat(ts: list["Targets"]) -> "Targets":
        return Targets(*[np.concatenate([getattr(t, f) for t in ts]) for f in
                         ("bucket", "label", "click_type", "log_dwell", "teacher_p", "impression_id", "user_id")])


def valid_targets(s: Sample) -> np.ndarray:
    return s.is_target & s.is_imp & (s.label >= 0)
