"""The served teacher sees more than the served student by construction (issue #33 item 2): every event the
student's graph sees, in the same sequence, plus older ones, unmerged, in more layers; and every merge the
served student is configured with acts in it."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import preset
from models.config import ModelSizes, student_config, teacher_context, teacher_config
from models.data import PackedLoader, litm_groups, patm_groups, student_tokens, teacher_tokens
from models.data.samples import A_NOCLICK, ACTION_IDS, Sample
from models.student import Student
from contracts import DAY_MS, ITEM_STAT_COLUMNS

TEACHER, STUDENT, _ = preset("demo")


def user_day(seed: int, n_history: int, imp_share: float, n_targets: int, n_day_behaviors: int) -> Sample:
    """A user's history (impressions and behaviors) and day D: n_targets impressions among n_day_behaviors
    behaviors, every event at its own millisecond."""
    rng = np.random.default_rng(seed)
    n_day = n_targets + n_day_behaviors
    n = n_history + n_day
    day0 = 40 * DAY_MS
    # an integer population: Generator.choice then samples without materialising 30 days of milliseconds
    ts = np.r_[day0 - 30 * DAY_MS + np.sort(rng.choice(30 * DAY_MS, n_history, replace=False)),
               day0 + np.sort(rng.choice(DAY_MS, n_day, replace=False))]
    is_imp = np.r_[rng.random(n_history) < imp_share, np.zeros(n_day, bool)]
    is_imp[n_history + rng.choice(n_day, n_targets, replace=False)] = True
    is_target = np.r_[np.zeros(n_history, bool), is_imp[n_history:]]
    return Sample(user_id="u", date="D", ts=ts, is_target=is_target, is_imp=is_imp,
                  ids=rng.integers(1, 30, (n, 7)), item_key=rng.integers(1, 400, n).astype(np.uint64),
                  action=np.where(is_imp, A_NOCLICK, ACTION_IDS["view"]), position=np.where(is_imp, 1, 0),
                  bucket=np.where(is_imp, 0, -1), label=np.where(is_imp, 0, -1), click_type=np.zeros(n, np.int64),
                  dwell_ms=np.full(n, np.nan), impression_id=np.array([f"i{k}" for k in range(n)], object),
                  teacher_p=np.full(n, np.nan, np.float32), item_stats=np.zeros((n, len(ITEM_STAT_COLUMNS)), np.float32))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), n_history=st.integers(0, 6000), imp_share=st.sampled_from([0.0, 0.3, 1.0]),
       n_targets=st.integers(1, TEACHER.max_len // 4), n_day_behaviors=st.integers(0, 300))
def test_the_teacher_sees_every_event_the_student_sees(seed, n_history, imp_share, n_targets, n_day_behaviors):
    s = user_day(seed, n_history, imp_share, n_targets, n_day_behaviors)
    seen_by_teacher = set(teacher_tokens(s, TEACHER.features, TEACHER.max_len).ts.tolist())
    student = student_tokens(s, STUDENT.features, STUDENT.max_len)
    assert set(student.ev_ts.tolist()) <= seen_by_teacher
    # and more, where the log has more: at least twice the student's events (one token of slack)
    assert len(seen_by_teacher) >= min(s.n_events, 2 * STUDENT.max_len - 1)


def test_the_served_teacher_is_the_larger_model_over_the_longer_context():
    sizes = ModelSizes()
    assert TEACHER == teacher_config(sizes) and STUDENT == student_config(sizes)
    assert TEACHER.max_len == teacher_context(STUDENT.max_len) == 4 * STUDENT.max_len == 4096
    assert TEACHER.backbone.n_layers > STUDENT.backbone.n_layers
    assert TEACHER.counter_len == STUDENT.counter_len == sizes.counter_events


def test_a_teacher_batch_must_hold_the_teachers_context(tmp_path):
    with pytest.raises(ValueError, match="cannot hold the teacher's 4096-token context"):
        PackedLoader(str(tmp_path), "teacher", TEACHER, token_budget=2048)
    PackedLoader(str(tmp_path), "teacher", TEACHER, token_budget=1024, world=4)


def test_every_merge_the_served_student_is_configured_with_acts():
    events = STUDENT.max_len
    rng = np.random.default_rng(0)
    items = rng.integers(0, 50, events).astype(np.uint64)   # repeats within LITM's gap
    litm = litm_groups(items, STUDENT.litm_T)
    assert STUDENT.litm and litm.max() + 1 < events
    assert STUDENT.patm and patm_groups(events, STUDENT.max_len, STUDENT.patm_bounds, STUDENT.patm_factors).max() + 1 < events
    assert Student(STUDENT).merge_layers() == set() and not STUDENT.lptm
    # a student deep enough for LPTM carries it, and it merges
    deeper = student_config(dataclasses.replace(ModelSizes(), student_layers=4))
    assert deeper.lptm and Student(deeper).merge_layers() == {2}
