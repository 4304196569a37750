"""The scored impressions' cross features (models.data.cross_counts, MTGR): exact counts of what serving sees,
the same for teacher, student and a serving request, and wired to their own target only."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mt_util import tiny_features, tiny_student, tiny_teacher
from contracts import DAY_MS
from contracts import ITEM_STAT_COLUMNS
from models.data import (CROSS_ACTIONS, CROSS_MATCH_FIELDS, F_ACTION, N_FIELDS, SAMPLE_ARRAYS, collate,
                         cross_counts, item_stat_features, iter_samples, n_counters, n_cross_features, request_tokens,
                         student_tokens, teacher_tokens)
from models.student import Student
from models.teacher import Teacher

HOUR_MS = 3_600_000


def _brute_force(ev, ts, q, cut, fc) -> np.ndarray:
    out = np.zeros((len(q), len(CROSS_MATCH_FIELDS), len(CROSS_ACTIONS), len(fc.cross_windows_days)))
    for i in range(len(q)):
        for m, col in enumerate(CROSS_MATCH_FIELDS):
            if col is not None and q[i, col] == 0:
                continue
            for a, action in enumerate(CROSS_ACTIONS):
                for w, days in enumerate(fc.cross_windows_days):
                    hit = (ev[:, F_ACTION] == action) & (ts <= cut[i]) & (ts > cut[i] - int(days * DAY_MS))
                    if col is not None:
                        hit &= ev[:, col] == q[i, col]
                    out[i, m, a, w] = hit.sum()
    return np.log1p(out).reshape(len(q), int(np.prod(out.shape[1:])))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cross_counts_equal_a_brute_force_count(data):
    """Field values 0-3 (0 = null) and times on a 40-day span, so matches, nulls, window edges and ties
    (an event exactly at a cut, exactly a window before it) all occur."""
    fc = dataclasses.replace(tiny_features(), cross_windows_days=data.draw(
        st.lists(st.sampled_from([0.5, 1.0, 7.0, 30.0]), min_size=1, max_size=3, unique=True).map(tuple)))
    E, Q = data.draw(st.integers(0, 25)), data.draw(st.integers(0, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ev = rng.integers(0, 4, (E, N_FIELDS))
    ev[:, F_ACTION] = rng.integers(0, 8, E)  # 0 and 7 are no outcome: never counted
    ts = np.sort(rng.integers(0, 40, E) * (DAY_MS // 2))
    q = rng.integers(0, 4, (Q, N_FIELDS))
    cut = rng.integers(-2, 90, Q) * (DAY_MS // 2)
    got = cross_counts(ev, ts, q, cut, fc)
    assert got.shape == (Q, n_counters(fc)) and got.dtype == np.float32
    np.testing.assert_allclose(got, _brute_force(ev, ts, q, cut, fc), rtol=1e-6)


def test_off_means_no_features():
    fc = dataclasses.replace(tiny_features(), cross_windows_days=(), item_stats=False)
    ev = np.ones((3, N_FIELDS), np.int64)
    assert cross_counts(ev, np.arange(3), ev, np.arange(3) + HOUR_MS, fc).shape == (3, 0)
    assert n_cross_features(fc) == 0 and n_cross_features(dataclasses.replace(fc, item_stats=True)) > 0
    assert Teacher(dataclasses.replace(tiny_teacher(), features=fc)).cross is None
    assert Student(dataclasses.replace(tiny_student(), features=fc)).cross is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**7), st.floats(0, 1)), min_size=len(ITEM_STAT_COLUMNS) // 2,
                max_size=len(ITEM_STAT_COLUMNS) // 2))
def test_item_stat_features_are_finite_and_an_unseen_id_sits_at_its_prior(shown_and_ctr):
    """Any counts (clicks <= impressions, zero included) give finite features; zero counts give log counts 0
    and the campaign's prior CTR for both levels (the ad's prior is its campaign's smoothed CTR)."""
    fc = tiny_features()
    counts = np.array([[v for shown, ctr in shown_and_ctr for v in (shown, np.floor(shown * ctr))]], np.float32)
    assert np.isfinite(item_stat_features(counts, fc)).all()
    assert np.isfinite(item_stat_features(counts[:, ::-1].copy(), fc)).all()   # clicks above impressions: corrupt, finite
    unseen = item_stat_features(np.zeros((1, len(ITEM_STAT_COLUMNS)), np.float32), fc).reshape(-1, 3)
    prior = np.log(fc.item_stats_prior_ctr / (1 - fc.item_stats_prior_ctr))
    np.testing.assert_allclose(unseen, np.tile([0.0, 0.0, prior], (len(unseen), 1)), atol=1e-6)


def test_an_ads_smoothed_ctr_follows_its_clicks_and_leans_on_its_campaign():
    fc = tiny_features()
    columns = {c: j for j, c in enumerate(ITEM_STAT_COLUMNS)}

    def ad_ctr_logit(ad, campaign):
        counts = np.zeros((1, len(ITEM_STAT_COLUMNS)), np.float32)
        for level, (shown, clicked) in (("ad", ad), ("campaign", campaign)):
            counts[0, columns[f"{level}_impressions_7d"]], counts[0, columns[f"{level}_clicks_7d"]] = shown, clicked
        return item_stat_features(counts, fc)[0, 5]   # the 7-day window: campaign's 3 features, then the ad's

    assert ad_ctr_logit((100, 20), (1000, 50)) > ad_ctr_logit((100, 2), (1000, 50))
    assert ad_ctr_logit((0, 0), (1000, 200)) > ad_ctr_logit((0, 0), (1000, 10))   # a new ad of a good campaign


def test_teacher_student_and_serving_count_the_same_events(samples_dir):
    """With the whole history kept, the teacher's targets (counted over its action and behavior tokens),
    the student's candidates (over its events) and a serving request for the same impressions
    (history = the user's events, candidates = the targets at their own time) get identical features."""
    cfg = tiny_student(max_len=0)
    checked = 0
    for s in iter_samples(samples_dir, cfg.features):
        t = teacher_tokens(s, cfg.features, 100_000, cfg.mask.delay_ms)
        st_ = student_tokens(s, cfg.features, 0, delay_ms=cfg.mask.delay_ms)
        np.testing.assert_array_equal(t.cross, st_.cand_cross)
        tgt = np.flatnonzero(s.is_target & s.is_imp & (s.label >= 0))
        if len(tgt):
            cands = dataclasses.replace(s, **{f: getattr(s, f)[tgt] for f in SAMPLE_ARRAYS})
            np.testing.assert_array_equal(request_tokens(s, cands, cfg).cand_cross, st_.cand_cross)
            checked += int((st_.cand_cross > 0).any(1).sum())
    assert checked > 20  # most targets have something to count


def test_counter_len_counts_the_log_beyond_what_the_tokens_keep(samples_dir):
    """counter_len (ModelSizes.counter_events): a teacher cut to a few tokens, a student that sees a few events
    and a serving request with the same stored log give their targets the counters of the uncut log; with
    counter_len None they count only what their tokens keep, and a counter_len of k counts the newest k events."""
    fc = tiny_features()
    cut_somewhere = checked = 0
    for s in iter_samples(samples_dir, fc):
        full = teacher_tokens(s, fc, 100_000, HOUR_MS)
        budget = 2 * int((s.is_target & s.is_imp & (s.label >= 0)).sum()) + 4
        kept = teacher_tokens(s, fc, budget, HOUR_MS)
        whole = teacher_tokens(s, fc, budget, HOUR_MS, counter_len=0)
        np.testing.assert_array_equal(whole.feats, kept.feats)
        np.testing.assert_array_equal(whole.targets.impression_id, full.targets.impression_id)
        np.testing.assert_array_equal(whole.cross, full.cross)
        cut_somewhere += kept.n_events < s.n_events and not np.array_equal(kept.cross, full.cross)

        short, long_ = tiny_student(max_len=3), tiny_student(max_len=3, counter_len=s.n_events)
        window = student_tokens(s, fc, 3, delay_ms=HOUR_MS)
        counted = student_tokens(s, fc, 3, delay_ms=HOUR_MS, counter_len=s.n_events)
        np.testing.assert_array_equal(counted.ev_feats, window.ev_feats)
        np.testing.assert_array_equal(counted.cand_cross, full.cross)
        newest = student_tokens(s, fc, 3, delay_ms=HOUR_MS, counter_len=3)
        np.testing.assert_array_equal(newest.cand_cross, window.cand_cross)
        tgt = np.flatnonzero(s.is_target & s.is_imp & (s.label >= 0))
        if len(tgt):
            cands = dataclasses.replace(s, **{f: getattr(s, f)[tgt] for f in SAMPLE_ARRAYS})
            np.testing.assert_array_equal(request_tokens(s, cands, long_).cand_cross, counted.cand_cross)
            np.testing.assert_array_equal(request_tokens(s, cands, short).cand_cross, window.cand_cross)
            checked += not np.array_equal(counted.cand_cross, window.cand_cross)
    assert cut_somewhere and checked  # the token budget and the 3-event window did drop counted events somewhere


def test_a_target_reads_its_own_cross_features_only(samples_dir):
    """Randomised weights (the adapter starts at zero): changing one target's cross features changes that
    target's logits and no other's, for the teacher (targets inside the sequence) and the student."""
    torch.manual_seed(0)
    for model, kind, key in ((Teacher(tiny_teacher()), "teacher", "cross"), (Student(tiny_student()), "student", "cand_cross")):
        with torch.no_grad():
            for p in model.cross.parameters():
                p.normal_(0, 0.3)
        model.eval()
        toks = [teacher_tokens(s, model.cfg.features, 256) if kind == "teacher" else student_tokens(s, model.cfg.features, 64)
                for s in iter_samples(samples_dir, model.cfg.features)]
        b = collate([t for t in toks if len(t.targets.label) >= 3][:4])
        with torch.no_grad():
            before = model(b)["logits"]
            j = before.shape[0] // 2
            b.tensors[key] = b.tensors[key].clone()
            b.tensors[key][j] += 1.0
            after = model(b)["logits"]
        changed = (after - before).abs().amax(1) > 1e-6
        assert changed[j] and int(changed.sum()) == 1, kind
