import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.metrics import (auc, calibration_by_bucket, effective_lengths, gauc, length_stats, log_loss, ratio_se,
                            summarize_predictions)


def brute_auc(y, s):
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5)), min_size=2, max_size=40))
def test_auc_matches_pairwise_definition_with_ties(pairs):
    y = np.array([p[0] for p in pairs])
    s = np.array([p[1] for p in pairs], float)
    if y.min() == y.max():
        assert np.isnan(auc(y, s))
    else:
        assert auc(y, s) == pytest.approx(brute_auc(y, s))


def test_gauc_is_impression_weighted_and_skips_single_class_users():
    u = np.array(["a"] * 4 + ["b"] * 2 + ["c"] * 3)
    y = np.array([1, 0, 1, 0, 1, 0, 1, 1, 1])
    s = np.array([0.9, 0.1, 0.8, 0.2, 0.1, 0.9, 0.5, 0.5, 0.5])
    # a: AUC 1 (4 impressions), b: AUC 0 (2 impressions), c skipped
    assert gauc(u, y, s) == pytest.approx((1.0 * 4 + 0.0 * 2) / 6)


def test_logloss_and_calibration():
    y = np.array([1, 0, 0, 1])
    p = np.array([0.5, 0.5, 0.25, 0.75])
    assert log_loss(y, p) == pytest.approx(-np.mean(np.log([0.5, 0.5, 0.75, 0.75])))
    cal = calibration_by_bucket(np.array([0, 0, 1, 1]), y, p).set_index("bucket")
    assert cal.loc[0, "calibration"] == pytest.approx(0.5 / 0.5)
    assert cal.loc[1, "calibration"] == pytest.approx(0.5 / 0.5)
    cal2 = calibration_by_bucket(np.array([0, 0, 1, 1]), y, p * 2 / 3).set_index("bucket")
    assert cal2.loc[0, "calibration"] == pytest.approx(2 / 3)


def _clustered_day(rng, users=150):
    """A day whose users differ in activity (log-normal, a long tail) and in CTR: one user's impressions
    share a rate the model only partly knows."""
    n = np.maximum(1, rng.lognormal(2.5, 1.1, users).astype(int))
    rate = rng.beta(1.0, 12.0, users)
    user = np.repeat(np.arange(users), n)
    y = (rng.random(len(user)) < rate[user]).astype(float)
    p = np.full(len(user), y.mean())  # a model that knows the day's rate, not the user's
    return user, y, p


def test_ratio_se_is_the_user_bootstrap_spread_and_exceeds_the_clicks_alone():
    rng = np.random.default_rng(0)
    user, y, p = _clustered_day(rng)
    se = ratio_se(p, y, user)
    users = np.unique(user)
    idx = {u: np.flatnonzero(user == u) for u in users}
    boot = []
    for _ in range(600):
        rows = np.concatenate([idx[u] for u in rng.choice(users, len(users))])
        boot.append(p[rows].sum() / y[rows].sum())
    assert se == pytest.approx(np.std(boot), rel=0.15)
    assert se > 1.5 * (p.sum() / y.sum()) / np.sqrt(y.sum())  # the binomial error of the clicks understates it


def test_ratio_se_shrinks_with_more_users_and_needs_clicks_from_two():
    rng = np.random.default_rng(1)
    user, y, p = _clustered_day(rng)
    twice = ratio_se(np.r_[p, p], np.r_[y, y], np.r_[user, user + user.max() + 1])
    assert twice == pytest.approx(ratio_se(p, y, user) / np.sqrt(2), rel=0.02)
    assert np.isnan(ratio_se([0.1, 0.2], [0, 0], [1, 2]))   # no click
    assert np.isnan(ratio_se([0.1, 0.2], [1, 0], [7, 7]))   # one user
    cal = calibration_by_bucket(np.zeros(len(y)), y, p, user)
    assert cal.loc[0, "calibration_se"] == pytest.approx(ratio_se(p, y, user))


def test_summaries_and_lengths():
    df = pd.DataFrame({"user_id": ["a", "a", "b", "b"], "position_bucket": [0, 1, 0, 1],
                       "p": [0.9, 0.2, 0.7, 0.1], "label": [1, 0, 1, 0]})
    m = summarize_predictions(df)
    assert m["auc"] == 1.0 and m["gauc"] == 1.0 and m["bucket0_n"] == 2
    assert m["bucket0_calibration_se"] == pytest.approx(ratio_se([0.9, 0.7], [1, 1], ["a", "b"]))
    st_ = length_stats(list(range(1, 11)))
    assert st_["avg"] == 5.5 and st_["p90"] == pytest.approx(9.1)
    assert effective_lengths([]) == {}
