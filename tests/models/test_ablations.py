"""The quality report's ablations of the student (benchmarks/quality_suite/ablations.py): subclasses of the
served config and model that change their tokens and forward; the served Student is left alone."""
import numpy as np
import pytest
import torch

from benchmarks.quality_suite.ablations import (NoHistoryConfig, NoHistoryStudent, PositionInputConfig,
                                                PositionInputStudent, ablated)
from deploy.onnx_export import RequestScorer
from mt_util import tiny_student
from models.data import F_BRAND, F_CAT, F_POS, F_TYPE, TT_CANDIDATE, PackedLoader, collate, iter_samples
from models.student import Student
from models.train import evaluate, fit_with_holdout, predict


def no_history(**kw) -> NoHistoryConfig:
    return ablated(tiny_student(), NoHistoryConfig, **kw)


def position_input(**kw) -> PositionInputConfig:
    return ablated(tiny_student(), PositionInputConfig, **kw)


def _model(cfg) -> Student:
    torch.manual_seed(0)
    return (cfg.build() if hasattr(cfg, "build") else Student(cfg)).eval()


def _batch(samples_dir, cfg, budget=400):
    return collate(next(iter(PackedLoader(samples_dir, "student", cfg, budget, seed=None,
                                          tokenizer=_model(cfg).tokenizer()))))


def test_ablations_add_no_parameters_and_leave_the_served_tokens_alone(samples_dir):
    cfg = tiny_student()
    assert type(_model(no_history())) is NoHistoryStudent and type(_model(position_input())) is PositionInputStudent
    # no extra parameters, the same initialisation as the served student
    for ablation in (no_history(), position_input()):
        a, b = _model(cfg).state_dict(), _model(ablation).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    batch = _batch(samples_dir, cfg)
    assert bool((batch.tensors["cand_feats"][:, F_POS] == 0).all())  # the scored impression's position is no input
    assert int(batch.tensors["hist_len"].sum()) > 0


def test_no_history_tokens_hold_only_the_candidates(samples_dir):
    cfg = no_history()
    tok, tok_full = _model(cfg).tokenizer(), _model(tiny_student()).tokenizer()
    for s in iter_samples(samples_dir, cfg.features):
        t, f = tok(s, 10_000), tok_full(s, 10_000)
        assert t.n_groups == 0 and t.n_events == 0 and len(t.ev_feats) == 0 and len(t.ev_group) == 0
        assert np.array_equal(t.cand_feats, f.cand_feats) and np.array_equal(t.cand_ts, f.cand_ts)
        assert np.array_equal(t.targets.impression_id, f.targets.impression_id)


def test_no_history_keeps_the_counters_only_when_asked(samples_dir):
    """keep_counters: no history tokens, but the candidates keep the full model's cross features."""
    full = _model(tiny_student()).tokenizer()
    bare = _model(no_history()).tokenizer()
    dlrm = _model(no_history(keep_counters=True)).tokenizer()
    counted = 0
    for s in iter_samples(samples_dir, tiny_student().features):
        f, b, d = full(s, 10_000), bare(s, 10_000), dlrm(s, 10_000)
        assert d.n_groups == 0 and len(d.ev_feats) == 0
        assert np.array_equal(d.cand_cross, f.cand_cross) and not b.cand_cross.any()
        counted += int(f.cand_cross.any(1).sum())
    assert counted > 0


def test_no_history_model_ignores_any_history_it_is_given(samples_dir):
    cfg = no_history()
    model = _model(cfg)
    with_hist = _batch(samples_dir, tiny_student())  # tokens that do carry history
    without = _batch(samples_dir, cfg)
    assert int(with_hist.tensors["hist_len"].sum()) > 0 and int(without.tensors["hist_len"].sum()) == 0
    with torch.no_grad():
        a = model(with_hist)["logits"]
        # the same candidates, history-free: identical scores
        t = dict(with_hist.tensors)
        t["ev_feats"], t["ev_group"] = t["ev_feats"][:0], t["ev_group"][:0]
        t["hist_ts"], t["hist_len"] = t["hist_ts"][:0], torch.zeros_like(t["hist_len"])
        b = model(type(with_hist)(with_hist.kind, with_hist.targets, 0, t))["logits"]
        t2 = dict(with_hist.tensors)
        t2["ev_feats"] = (t2["ev_feats"] + 3) % 8  # scrambled history: no effect either
        c = model(type(with_hist)(with_hist.kind, with_hist.targets, with_hist.n_events, t2))["logits"]
    assert torch.isfinite(a).all()
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(a, c, atol=1e-6)
    # a model with history does depend on it
    full = _model(tiny_student())
    with torch.no_grad():
        assert not torch.allclose(full(with_hist)["logits"], full(type(with_hist)(with_hist.kind, with_hist.targets,
                                                                                  with_hist.n_events, t2))["logits"],
                                  rtol=0, atol=1e-7)


def test_position_input_tokens_carry_the_real_position(samples_dir):
    cfg = position_input()
    tok = _model(cfg).tokenizer()
    n = 0
    for s in iter_samples(samples_dir, cfg.features):
        t = tok(s, 10_000)
        tgt = s.is_target & s.is_imp & (s.label >= 0)
        assert np.array_equal(t.cand_feats[:, F_POS], np.clip(s.position[tgt], 0, cfg.features.max_position))
        assert np.all(t.cand_feats[:, F_TYPE] == TT_CANDIDATE)
        n += len(t.cand_ts)
        small = tok(s, 3)  # a budget that cuts the candidates to the newest: positions still line up
        assert np.array_equal(small.cand_feats[:, F_POS], np.clip(s.position[tgt][-len(small.cand_ts):], 0,
                                                                  cfg.features.max_position))
    assert n > 0


def test_position_input_uses_the_real_position_in_training_and_the_default_at_serving(samples_dir):
    cfg = position_input(serving_position=2, backbone=tiny_student(backbone=dict(n_buckets=1)).backbone)
    model = _model(cfg)
    b = _batch(samples_dir, cfg)
    pos = b.tensors["cand_feats"][:, F_POS].clone()
    assert bool((pos > 0).all()) and len(set(pos.tolist())) > 1
    # serving output = the output with every candidate put at the default slot
    t = dict(b.tensors)
    t["cand_feats"] = b.tensors["cand_feats"].clone()
    t["cand_feats"][:, F_POS] = 2
    with torch.no_grad():
        out = model(b)["logits"]
        assert torch.equal(b.tensors["cand_feats"][:, F_POS], pos)  # the batch itself is left alone
        same = model(type(b)(b.kind, b.targets, b.n_events, t))["logits"]
        assert out.shape[1] == 1 and torch.allclose(out, same, atol=1e-6)
        # in training the position changes the score (it is an input)
        t3 = dict(b.tensors)
        t3["cand_feats"] = b.tensors["cand_feats"].clone()
        t3["cand_feats"][:, F_POS] = 1
        tr = model(b, serving=False)["logits"]
        assert not torch.allclose(tr, model(type(b)(b.kind, b.targets, b.n_events, t3), serving=False)["logits"],
                                  rtol=0, atol=1e-7)


def test_ablated_students_train_and_predict_through_their_own_tokens(samples_dir):
    from models.config import TrainConfig
    tc = TrainConfig(lr=3e-3, token_budget=400, epochs=10, max_steps=3, log_every=1000, warmup_steps=1, seed=0,
                     device="cpu")
    for cfg in (no_history(), position_input(backbone=tiny_student(backbone=dict(n_buckets=1)).backbone)):
        torch.manual_seed(0)
        res = fit_with_holdout(cfg.build(), samples_dir, tc)
        assert type(res.model) is type(_model(cfg)) and res.step == 3
        assert all(np.isfinite(h["loss"]) for h in res.history)
        p = predict(res.model, samples_dir, with_labels=True)
        assert len(p) > 0 and np.isfinite(p["p"]).all()
    m = evaluate(res.model, samples_dir)
    bucket0 = p[p["position_bucket"] == 0]
    assert m["n"] == len(p)
    assert m["bucket0_calibration"] == pytest.approx(bucket0["p"].mean() / bucket0["label"].mean())


def test_an_ablated_student_is_refused_by_the_onnx_export():
    with pytest.raises(ValueError, match="not the served Student"):
        RequestScorer(_model(no_history()))


def learned_counts(**kw):
    from benchmarks.quality_suite.ablations import LearnedCountsConfig
    return ablated(tiny_student(), LearnedCountsConfig, **kw)


def _learned_reference(lc, pairs):
    """LearnedCounts' features (before its adapter) by a loop: ``pairs`` holds, per scored token, its feats, its time
    and the (feats, time) of each event it may count."""
    from models.data import F_ACTION
    tau, rows = torch.exp(lc.log_tau), []
    for cand, cand_ts, events in pairs:
        cat_sum, brand_sum = torch.zeros(lc.h), torch.zeros(lc.h)
        for ev, ev_ts in events:
            decay = torch.exp(-max((cand_ts - ev_ts) / 3.6e6, 0.0) / tau)
            u, v = lc.u.weight[cand[F_CAT]].view(lc.h, lc.r), lc.v.weight[ev[F_CAT]].view(lc.h, lc.r)
            cat_sum += decay * torch.nn.functional.softplus(lc.scale * (u * v).sum(1) + lc.b)
            if cand[F_BRAND] > 0 and ev[F_BRAND] == cand[F_BRAND]:
                brand_sum += decay * lc.brand_action[:, ev[F_ACTION]]
        rows.append(torch.cat([torch.log1p(cat_sum), brand_sum]))
    return torch.stack(rows)


def _student_pairs(batch, cut):
    """Each candidate with the events of its own history whose group is visible at its cut (the running maximum of
    its sequence's group times at or before the cut)."""
    t = batch.tensors
    g0 = np.concatenate([[0], np.cumsum(t["hist_len"].tolist())])
    c0 = np.concatenate([[0], np.cumsum(t["cand_len"].tolist())])
    pairs = []
    for s in range(len(t["hist_len"])):
        running = np.maximum.accumulate(t["hist_ts"][g0[s]:g0[s + 1]].numpy()) if g0[s + 1] > g0[s] else np.zeros(0)
        for c in range(c0[s], c0[s + 1]):
            visible = g0[s] + np.flatnonzero(running <= int(cut[c]))
            pairs.append((t["cand_feats"][c], int(t["cand_ts"][c]),
                          [(t["ev_feats"][e], int(t["hist_ts"][t["ev_group"][e]]))
                           for e in np.flatnonzero(np.isin(t["ev_group"].numpy(), visible))]))
    return pairs


def _perturbed(model):
    with torch.no_grad():
        torch.manual_seed(1)
        for p in (model.learned.u.weight, model.learned.b, model.learned.brand_action, model.learned.out[-1].weight):
            p.normal_(0, 0.3)
    return model


def _scrambled(batch, key: str, rows):
    """The batch with the category and brand of ``rows`` of tensor ``key`` changed."""
    t = dict(batch.tensors)
    t[key] = t[key].clone()
    ids = torch.tensor([F_CAT, F_BRAND])
    moved = t[key][rows]
    moved[:, ids] = (moved[:, ids] + 5) % 17
    t[key][rows] = moved
    return type(batch)(batch.kind, batch.targets, batch.n_events, t)


def test_learned_counts_match_a_loop_over_each_candidates_visible_events(samples_dir):
    """What the learnt-match counters feed the candidates equals a per-candidate loop over the events its
    attention sees (nothing newer than its cut), with non-trivial weights; the features then go through the
    adapter, which starts at zero, so at initialisation the model scores exactly as the student it extends."""
    cfg = learned_counts()
    model = _model(cfg)
    batch = _batch(samples_dir, cfg)
    with torch.no_grad():
        assert torch.allclose(model(batch)["logits"], _model(tiny_student())(batch)["logits"], atol=1e-6)
        _perturbed(model)
        cut = batch.tensors["cand_ts"] - model.delay_ms(True)
        features = model.learned.student_counts(batch, cut)
        assert features.shape == (len(batch.tensors["cand_ts"]), 2 * model.learned.h)
        assert len(batch.tensors["cand_len"]) > 1  # several users: none may count another's events
        assert torch.allclose(features, _learned_reference(model.learned, _student_pairs(batch, cut)), rtol=1e-4,
                              atol=1e-5)
        assert bool((features[:, model.learned.h:] != 0).any())  # some candidate's brand is in its history


def test_learned_counts_never_see_an_event_after_the_cut(samples_dir):
    model = _perturbed(_model(learned_counts()))
    batch = _batch(samples_dir, model.cfg)
    t = batch.tensors
    delay = model.delay_ms(True)
    with torch.no_grad():
        before = model.learned(batch, delay)
        # every group newer than the newest cut is scrambled: no candidate's features may move
        late = t["hist_ts"] > int((t["cand_ts"] - delay).max())
        assert bool(late.any())
        assert torch.equal(model.learned(_scrambled(batch, "ev_feats", late[t["ev_group"]]), delay), before)
        # and an earlier event does move them
        assert not torch.allclose(model.learned(_scrambled(batch, "ev_feats", slice(None)), delay), before)


def test_the_learned_counts_teacher_counts_its_outcome_tokens_before_each_target(samples_dir):
    """The teacher's variant: each target counts the outcome tokens (behaviours, impressions' action tokens) of its
    own sequence at or before its time minus the delay; it starts as the teacher it extends."""
    from benchmarks.quality_suite.ablations import LearnedCountsTeacherConfig
    from models.data import CROSS_ACTIONS, F_ACTION
    from mt_util import tiny_teacher
    from models.teacher import Teacher

    cfg = ablated(tiny_teacher(), LearnedCountsTeacherConfig)
    torch.manual_seed(0)
    model = cfg.build().eval()
    batch = collate(next(iter(PackedLoader(samples_dir, "teacher", cfg, 400, seed=None, tokenizer=model.tokenizer()))))
    torch.manual_seed(0)
    with torch.no_grad():
        assert torch.allclose(model(batch)["logits"], Teacher(tiny_teacher()).eval()(batch)["logits"], atol=1e-6)
        _perturbed(model)
        t, delay = batch.tensors, model.delay_ms(True)
        off = t["offsets"].tolist()
        pairs = []
        for s in range(len(off) - 1):
            rows = range(off[s], off[s + 1])
            events = [r for r in rows if int(t["feats"][r, F_ACTION]) in CROSS_ACTIONS]
            pairs += [(t["feats"][q], int(t["ts"][q]), [(t["feats"][e], int(t["ts"][e])) for e in events
                                                        if int(t["ts"][e]) <= int(t["ts"][q]) - delay])
                      for q in rows if t["is_target"][q]]
        assert len(off) > 2 and len(pairs) == int(t["is_target"].sum())
        features = model.learned.teacher_counts(batch, delay)
        assert torch.allclose(features, _learned_reference(model.learned, pairs), rtol=1e-4, atol=1e-5)
        assert bool((features != 0).any())
