"""The ablation switches of the quality report (StudentConfig.use_history, position_input)."""
import numpy as np
import pytest
import torch

from mt_util import tiny_student
from models.data import F_POS, F_TYPE, TT_CANDIDATE, PackedLoader, collate, iter_samples, tokenizer_for
from models.student import Student
from models.train import evaluate, load_model, predict, save_model, train_student


def _batch(samples_dir, cfg, budget=400):
    return collate(next(iter(PackedLoader(samples_dir, "student", cfg, budget, seed=None))))


def _model(cfg) -> Student:
    torch.manual_seed(0)
    return Student(cfg).eval()


def test_defaults_leave_the_model_and_its_tokens_unchanged(samples_dir):
    cfg = tiny_student()
    assert cfg.use_history and not cfg.position_input
    # no extra parameters, same initialisation as before the switches existed
    a, b = _model(cfg).state_dict(), _model(tiny_student(use_history=False, position_input=True)).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    batch = _batch(samples_dir, cfg)
    assert bool((batch.tensors["cand_feats"][:, F_POS] == 0).all())  # the scored impression's position is no input
    assert int(batch.tensors["hist_len"].sum()) > 0


def test_no_history_tokens_hold_only_the_candidates(samples_dir):
    cfg = tiny_student(use_history=False)
    full = tiny_student()
    tok, tok_full = tokenizer_for("student", cfg), tokenizer_for("student", full)
    for s in iter_samples(samples_dir, cfg.features):
        t, f = tok(s, 10_000), tok_full(s, 10_000)
        assert t.n_groups == 0 and t.n_events == 0 and len(t.ev_feats) == 0 and len(t.ev_group) == 0
        assert np.array_equal(t.cand_feats, f.cand_feats) and np.array_equal(t.cand_ts, f.cand_ts)
        assert np.array_equal(t.targets.impression_id, f.targets.impression_id)


def test_no_history_keeps_the_counters_only_when_asked(samples_dir):
    """counters_without_history: no history tokens, but the candidates keep the full model's cross features."""
    full = tokenizer_for("student", tiny_student())
    bare = tokenizer_for("student", tiny_student(use_history=False))
    dlrm = tokenizer_for("student", tiny_student(use_history=False, counters_without_history=True))
    counted = 0
    for s in iter_samples(samples_dir, tiny_student().features):
        f, b, d = full(s, 10_000), bare(s, 10_000), dlrm(s, 10_000)
        assert d.n_groups == 0 and len(d.ev_feats) == 0
        assert np.array_equal(d.cand_cross, f.cand_cross) and not b.cand_cross.any()
        counted += int(f.cand_cross.any(1).sum())
    assert counted > 0


def test_no_history_model_ignores_any_history_it_is_given(samples_dir):
    cfg = tiny_student(use_history=False)
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
    cfg = tiny_student(position_input=True)
    tok = tokenizer_for("student", cfg)
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
    cfg = tiny_student(position_input=True, serving_position=2, backbone=dict(n_buckets=1))
    model = _model(cfg)
    b = _batch(samples_dir, cfg)
    pos = b.tensors["cand_feats"][:, F_POS]
    assert bool((pos > 0).all()) and len(set(pos.tolist())) > 1
    f_train, f_serve = model.candidate_feats(b, serving=False), model.candidate_feats(b, serving=True)
    assert torch.equal(f_train, b.tensors["cand_feats"])
    assert bool((f_serve[:, F_POS] == 2).all())
    assert torch.equal(b.tensors["cand_feats"][:, F_POS], pos)  # the batch itself is left alone
    # serving output = the output with every candidate put at the default slot
    t = dict(b.tensors)
    t["cand_feats"] = f_serve
    with torch.no_grad():
        out = model(b)["logits"]
        same = model(type(b)(b.kind, b.targets, b.n_events, t))["logits"]
        assert out.shape[1] == 1 and torch.allclose(out, same, atol=1e-6)
        # in training the position changes the score (it is an input)
        t3 = dict(b.tensors)
        t3["cand_feats"] = b.tensors["cand_feats"].clone()
        t3["cand_feats"][:, F_POS] = 1
        tr = model(b, serving=False)["logits"]
        assert not torch.allclose(tr, model(type(b)(b.kind, b.targets, b.n_events, t3), serving=False)["logits"],
                                  rtol=0, atol=1e-7)


def test_ablated_students_train_predict_and_round_trip(samples_dir, tmp_path):
    from models.config import TrainConfig
    tc = TrainConfig(lr=3e-3, token_budget=400, epochs=10, max_steps=3, log_every=1000, warmup_steps=1, seed=0,
                     device="cpu")
    for i, cfg in enumerate((tiny_student(use_history=False), tiny_student(position_input=True,
                                                                           backbone=dict(n_buckets=1)))):
        res = train_student(samples_dir, None, cfg, tc)
        assert res.step == 3 and all(np.isfinite(h["loss"]) for h in res.history)
        p = predict(res.model, samples_dir)
        path = save_model(res.model, str(tmp_path / f"m{i}.pt"))
        back = load_model(path)
        assert back.cfg.use_history == cfg.use_history and back.cfg.position_input == cfg.position_input
        assert np.allclose(predict(back, samples_dir)["p"], p["p"], atol=1e-6)
    m = evaluate(res.model, samples_dir)
    scored = predict(res.model, samples_dir, with_labels=True)
    bucket0 = scored[scored["position_bucket"] == 0]
    assert m["n"] == len(p)
    assert m["bucket0_calibration"] == pytest.approx(bucket0["p"].mean() / bucket0["label"].mean())
