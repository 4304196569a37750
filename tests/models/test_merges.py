"""Token merges (TM20K): LITM, PATM, LPTM. Mass preserved, candidates never merged, lengths as configured."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mt_util import tiny_student
from models.data import PackedLoader, collate, iter_samples, litm_groups, patm_groups, student_tokens
from models.student import Student, pair_merge


def litm_loop(items, T):
    """Literal TM20K LITM: walk the sequence, keep item -> (group, last index) of its most recent group."""
    groups, last, out = 0, {}, []
    for i, it in enumerate(items):
        if it in last and i - last[it][1] <= T:
            g = last[it][0]
        else:
            g = groups
            groups += 1
        last[it] = (g, i)
        out.append(g)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=40), st.sampled_from([1, 3, 10]))
def test_litm_matches_the_literal_algorithm(items, T):
    got = litm_groups(np.array(items, dtype=np.uint64), T)
    assert np.array_equal(got, litm_loop(items, T))


def test_litm_T_behaviour():
    seq = np.array([7, 7, 1, 7, 2, 3, 4, 5, 6, 7, 8, 8], dtype=np.uint64)
    n1 = litm_groups(seq, 1).max() + 1
    n3 = litm_groups(seq, 3).max() + 1
    n10 = litm_groups(seq, 10).max() + 1
    # T=1: only adjacent repeats (7,7) and (8,8) merge; T=3 also joins the 7 at gap 2;
    # T=10 also joins the 7 at gap 6
    assert (n1, n3, n10) == (10, 9, 8)
    g = litm_groups(seq, 3)
    assert g[0] == g[1] == g[3] and g[9] != g[0]


def test_patm_lengths_as_configured():
    # newest 5% whole, then factors 2, 3, 4 on [5%,25%), [25%,50%), [50%,100%) of max_len
    n, L = 400, 400
    g = patm_groups(n, L, (0.05, 0.25, 0.5, 1.0), (1, 2, 3, 4))
    expect = 20 + 80 // 2 + int(np.ceil(100 / 3)) + 200 // 4
    assert g.max() + 1 == expect
    # the newest 20 tokens are kept whole, in order
    assert np.array_equal(g[-20:], np.arange(expect - 20, expect))
    # groups are contiguous and ordered oldest -> newest
    assert np.all(np.diff(g) >= 0)
    # shorter history than the first bound: untouched
    assert np.array_equal(patm_groups(15, L, (0.05, 0.25, 0.5, 1.0), (1, 2, 3, 4)), np.arange(15))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 10_000))
def test_lptm_pair_merge_preserves_mass_per_sequence(lens, seed):
    g = torch.Generator().manual_seed(seed)
    lens_t = torch.tensor(lens)
    x = torch.randn(int(lens_t.sum()), 4, generator=g, dtype=torch.float64)
    ts = torch.randint(0, 100, (x.shape[0],), generator=g)
    xn, tn, nl = pair_merge(x, ts, lens_t)
    assert nl.tolist() == [(n + 1) // 2 for n in lens]
    off, noff = np.r_[0, np.cumsum(lens)], np.r_[0, np.cumsum(nl.tolist())]
    for b in range(len(lens)):
        assert torch.allclose(x[off[b]:off[b + 1]].sum(0), xn[noff[b]:noff[b + 1]].sum(0))
        assert int(tn[noff[b]:noff[b + 1]].max()) == int(ts[off[b]:off[b + 1]].max())
    assert torch.allclose(xn[0], x[:min(2, lens[0])].sum(0))


def test_input_merges_preserve_embedding_mass_and_never_touch_candidates(samples_dir):
    cfg = tiny_student(max_len=32, litm_T=3)
    model = Student(cfg)
    batch = collate(next(iter(PackedLoader(samples_dir, "student", cfg, token_budget=400, seed=None))))
    t = batch.tensors
    with torch.no_grad():
        e = model.embed(t["ev_feats"]).double()
        groups = model.embed_history(batch).double()
        # mass: per sample, the sum over groups equals the sum over its history events
        ev_off = np.r_[0, np.cumsum(t["ev_len"].numpy())]
        g_off = np.r_[0, np.cumsum(t["hist_len"].numpy())]
        for b in range(len(g_off) - 1):
            assert torch.allclose(e[ev_off[b]:ev_off[b + 1]].sum(0), groups[g_off[b]:g_off[b + 1]].sum(0), atol=1e-5)
    # merging actually happened, and every group is within its sample
    assert int(t["hist_len"].sum()) < int(t["ev_len"].sum())
    # candidates: one token per target impression, never merged
    assert t["cand_feats"].shape[0] == len(batch.targets.label) == int(t["cand_len"].sum())


def test_student_lengths_and_switches(samples_dir):
    cfg_all = tiny_student(max_len=40)
    s = next(iter_samples(samples_dir, cfg_all.features))
    none = student_tokens(s, cfg_all.features, 40, litm=False, patm=False)
    litm = student_tokens(s, cfg_all.features, 40, litm=True, patm=False)
    both = student_tokens(s, cfg_all.features, 40, litm=True, patm=True)
    n = min(40, s.n_events)
    assert none.n_groups == n
    assert litm.n_groups == int(litm_groups(s.item_key[-n:], 3).max()) + 1
    assert both.n_groups <= litm.n_groups < none.n_groups
    # LPTM: the 2-layer-per-merge schedule on a 4-layer student halves the history once
    model = Student(tiny_student(max_len=40, backbone=dict(n_layers=4)))
    batch = collate([both])
    model(batch)
    assert model.last_lengths == [both.n_groups, (both.n_groups + 1) // 2]
    model_off = Student(tiny_student(max_len=40, lptm=False, backbone=dict(n_layers=4)))
    model_off(batch)
    assert model_off.last_lengths == [both.n_groups]


def test_a_user_day_with_too_many_targets_is_split_so_every_target_is_scored(tmp_path):
    from models.data import split_by_targets
    from testkit.synthetic_samples import write_training_samples
    from mt_util import tiny_teacher

    paths = write_training_samples(str(tmp_path), n_users=3, max_requests=12, candidates=(8, 10), seed=4)
    cfg = tiny_teacher(max_len=64)  # room for 16 targets per sequence
    samples = list(iter_samples(paths, cfg.features))
    assert max(int((s.is_target & s.is_imp).sum()) for s in samples) > 16
    for s in samples:
        for p in split_by_targets(s, 16):
            assert p.is_target.sum() <= 16 and p.ts[-1] <= s.ts[-1]
    loader = PackedLoader(paths, "teacher", cfg, 4096, seed=None)
    scored = [iid for toks in loader.iter_epoch(0) for t in toks for iid in t.targets.impression_id]
    expected = [iid for s in samples for iid in s.impression_id[s.is_target & s.is_imp & (s.label >= 0)]]
    assert sorted(scored) == sorted(expected) and len(set(scored)) == len(scored)
