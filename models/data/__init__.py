"""Training samples -> tokens -> packed jagged batches, and serving requests through the same tokens.

Modules, in the order data flows through them:
    samples         reading the `training_samples` contract as per-user Samples, stable hashing, the
                    held-out slice by time and the observed base rates
    tokens          the token layout both models share (fields, token types, vocabularies, Targets)
    cross           what the scored token knows beside the sequence: MTGR's cross features, item statistics
    teacher_tokens  the teacher's interleaved (content, action) tokens
    student_tokens  the student's tokens and their LITM / PATM merges
    serving         a serving request as student tokens (the training tokenisation, not a second one)
    batches         packing into fixed-token-budget batches, the deterministic loader, DDP splits

This package's names are its public API (models/, deploy/, tests and benchmarks import them from here).
"""
from .batches import Batch, PackedLoader, collate, collate_student, collate_teacher, split_for_ranks, tokenizer_for
from .cross import (CROSS_ACTIONS, CROSS_MATCH_FIELDS, cross_counts, item_stat_features, n_counters, n_cross_features,
                    scored_features)
from .samples import (A_CLICK, A_NOCLICK, ACTION_IDS, CLICK_TYPE_IDS, HASHED, READ_COLUMNS, SAMPLE_ARRAYS, Sample,
                      TeacherProbs, hash_ids, iter_file_samples, iter_samples, list_sample_files, observed_ctr,
                      split_by_targets, stable_hash, time_holdout)
from .serving import request_tokens, sample_from_frame
from .student_tokens import StudentTokens, litm_groups, patm_groups, student_tokens
from .teacher_tokens import TeacherTokens, teacher_tokens
from .tokens import (F_ACTION, F_ADV, F_BRAND, F_CAMPAIGN, F_CAT, F_CTYPE, F_DEVICE, F_DWELL, F_HOUR, F_ITEM, F_POS,
                     F_SURFACE, F_TYPE, ID_FIELDS, N_ACTIONS, N_FIELDS, N_HOURS, N_TOKEN_TYPES, TT_BEHAVIOR,
                     TT_CANDIDATE, TT_IMP_ACTION, TT_IMP_CONTENT, TT_IMP_EVENT, Targets, field_vocab)

__all__ = [
    "Batch", "PackedLoader", "collate", "collate_student", "collate_teacher", "split_for_ranks", "tokenizer_for",
    "CROSS_ACTIONS", "CROSS_MATCH_FIELDS", "cross_counts", "item_stat_features", "n_counters", "n_cross_features",
    "scored_features",
    "A_CLICK", "A_NOCLICK", "ACTION_IDS", "CLICK_TYPE_IDS", "HASHED", "READ_COLUMNS", "SAMPLE_ARRAYS", "Sample",
    "TeacherProbs", "hash_ids", "iter_file_samples", "iter_samples", "list_sample_files", "observed_ctr",
    "split_by_targets", "stable_hash", "time_holdout",
    "request_tokens", "sample_from_frame",
    "StudentTokens", "litm_groups", "patm_groups", "student_tokens",
    "TeacherTokens", "teacher_tokens",
    "F_ACTION", "F_ADV", "F_BRAND", "F_CAMPAIGN", "F_CAT", "F_CTYPE", "F_DEVICE", "F_DWELL", "F_HOUR", "F_ITEM",
    "F_POS", "F_SURFACE", "F_TYPE", "ID_FIELDS", "N_ACTIONS", "N_FIELDS", "N_HOURS", "N_TOKEN_TYPES", "TT_BEHAVIOR",
    "TT_CANDIDATE", "TT_IMP_ACTION", "TT_IMP_CONTENT", "TT_IMP_EVENT", "Targets", "field_vocab",
]
