"""Data reading, overfitting, gradients, checkpoint/resume, prediction, distillation, leakage."""
import numpy as np
import pandas as pd
import pytest
import torch

from mt_util import tiny_student, tiny_teacher
from models.config import TrainConfig
from models.data import PackedLoader, collate, hash_ids, iter_file_samples, iter_samples, list_sample_files
from models.masks import segment_cummax, seq_index
from models.student import Student
from models.teacher import Teacher
from models.train import evaluate, load_model, predict, save_model, train_student, train_teacher


# ----------------------------------------------------------------------------- data

def test_hash_is_stable_and_vectorised():
    ids = np.array(["ad1", "ad2", None, "ad1"], dtype=object)
    h = hash_ids(ids, 1 << 20)
    assert h[0] == h[3] and h[2] == 0 and h[0] != h[1]
    assert h[0] == 198196  # pinned: must never change between processes / releases
    assert np.all((h[[0, 1]] >= 1) & (h[[0, 1]] < 1 << 20))


def test_streaming_by_row_group_equals_whole_file(samples_dir, tmp_path):
    import pyarrow.parquet as pq
    cfg = tiny_teacher()
    f = list_sample_files(samples_dir)[0]
    assert pq.ParquetFile(f).num_row_groups > 3  # users straddle row groups
    one = tmp_path / "date=2026-01-10" / "part-0.parquet"
    one.parent.mkdir()
    pq.write_table(pq.read_table(f), one)  # a single row group
    a = list(iter_file_samples(f, cfg.features))
    b = list(iter_file_samples(str(one), cfg.features))
    assert [s.user_id for s in a] == [s.user_id for s in b] == sorted({s.user_id for s in a})
    for x, y in zip(a, b):
        assert np.array_equal(x.ts, y.ts) and np.array_equal(x.ids, y.ids) and np.array_equal(x.label, y.label)


def test_shuffle_is_deterministic_by_seed(samples_dir):
    fc = tiny_teacher().features
    key = lambda it: [(s.user_id, s.date) for s in it]  # noqa: E731
    a = key(iter_samples(samples_dir, fc, seed=1, shuffle_buffer=5))
    b = key(iter_samples(samples_dir, fc, seed=1, shuffle_buffer=5))
    c = key(iter_samples(samples_dir, fc, seed=2, shuffle_buffer=5))
    d = key(iter_samples(samples_dir, fc, seed=1, epoch=1, shuffle_buffer=5))
    assert a == b and sorted(a) == sorted(c) and a != c and a != d


def test_packing_respects_token_budget_without_padding(samples_dir):
    for kind, cfg in (("teacher", tiny_teacher()), ("student", tiny_student())):
        n_t = 0
        for toks in PackedLoader(samples_dir, kind, cfg, token_budget=150, seed=0):
            b = collate(toks)
            assert b.n_tokens <= 150
            n_t += len(b.targets.label)
        assert n_t == sum(int(s.is_target.sum()) for s in iter_samples(samples_dir, cfg.features))


def test_teacher_interleaves_content_and_action_tokens(samples_dir):
    from models.data import F_POS, F_TYPE, TT_IMP_ACTION, TT_IMP_CONTENT, teacher_tokens
    cfg = tiny_teacher()
    s = next(iter_samples(samples_dir, cfg.features))
    t = teacher_tokens(s, cfg.features, 10_000)
    assert t.n_tokens == s.n_events + int(s.is_imp.sum())
    content = np.flatnonzero(t.feats[:, F_TYPE] == TT_IMP_CONTENT)
    assert np.all(t.feats[content + 1, F_TYPE] == TT_IMP_ACTION)
    assert np.all(t.feats[content, F_POS] == 0)          # position never on the scored (content) token
    assert np.all(t.feats[content + 1, F_POS] > 0)       # but an input of the (history) action token
    assert t.is_target.sum() == s.is_target.sum()


# ----------------------------------------------------------------------------- training

def _tc(**kw):
    base = dict(lr=3e-3, token_budget=4096, epochs=1000, log_every=1000, warmup_steps=5, seed=0, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_tiny_overfit(overfit_dir, kind):
    tc = _tc(max_steps=120)
    if kind == "teacher":
        res = train_teacher(overfit_dir, tiny_teacher(), tc)
    else:
        res = train_student(overfit_dir, None, tiny_student(), tc)
    first, last = res.history[0]["ctr"], res.history[-1]["ctr"]
    assert first > 0.5
    assert last < 0.05, (first, last)
    assert all(np.isfinite(h["loss"]) and np.isfinite(h["grad_norm"]) for h in res.history)


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_gradients_finite_and_reach_every_parameter(samples_dir, kind):
    cfg = tiny_teacher() if kind == "teacher" else tiny_student(backbone=dict(n_layers=3))
    model = Teacher(cfg) if kind == "teacher" else Student(cfg)
    b = collate(next(iter(PackedLoader(samples_dir, kind, cfg, 300, seed=0))))
    out = model(b, serving=False)
    loss = sum(w * s for s, _, w in model.loss_sums(out, b.target_tensors("cpu")).values())
    loss.backward()
    for n, p in model.named_parameters():
        if n.startswith("distill_head") or n.startswith("aux"):
            pass  # all used in training mode
        assert p.grad is not None, n
        assert torch.isfinite(p.grad).all(), n


def test_min_steps_adds_whole_passes_until_reached_and_max_steps_still_caps(samples_dir):
    per_pass = train_student(samples_dir, None, tiny_student(), _tc(token_budget=300, epochs=1)).step
    floor = 2 * per_pass + 1
    res = train_student(samples_dir, None, tiny_student(), _tc(token_budget=300, epochs=1, min_steps=floor))
    passes = sorted({h["epoch"] for h in res.history})
    assert passes == [0, 1, 2]  # two passes fall short, the third reaches the floor and is finished
    assert sum(h["epoch"] < 2 for h in res.history) < floor <= res.step
    capped = train_student(samples_dir, None, tiny_student(),
                           _tc(token_budget=300, epochs=1, min_steps=10 * per_pass, max_steps=per_pass + 2))
    assert capped.step == per_pass + 2


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_checkpoint_resume_gives_the_same_next_step(samples_dir, tmp_path, kind):
    cfg = tiny_teacher() if kind == "teacher" else tiny_student()
    train_fn = (lambda tc, **kw: train_teacher(samples_dir, cfg, tc, **kw)) if kind == "teacher" else \
        (lambda tc, **kw: train_student(samples_dir, None, cfg, tc, **kw))
    straight = train_fn(_tc(token_budget=200, max_steps=4))
    ck = str(tmp_path / "ck")
    first = train_fn(_tc(token_budget=200, max_steps=3), ckpt_dir=ck)
    resumed = train_fn(_tc(token_budget=200, max_steps=4), ckpt_dir=ck)
    assert first.step == 3 and resumed.step == 4 and len(resumed.history) == 1
    assert resumed.history[0]["loss"] == pytest.approx(straight.history[3]["loss"], rel=1e-5, abs=1e-7)
    sd_a, sd_b = straight.model.state_dict(), resumed.model.state_dict()
    for k in sd_a:
        assert torch.allclose(sd_a[k], sd_b[k], atol=1e-6), k
    # and the resumed step is not a repeat of step 3
    assert resumed.history[0]["loss"] != pytest.approx(straight.history[2]["loss"], rel=1e-6)


def test_predict_save_load_and_student_distillation(samples_dir, tmp_path):
    teacher = train_teacher(samples_dir, tiny_teacher(), _tc(max_steps=3)).model
    pred = predict(teacher, samples_dir)
    assert list(pred.columns) == ["impression_id", "user_id", "position_bucket", "p_bucket_0", "p_bucket_1", "p", "logit"]
    assert pred["impression_id"].is_unique and len(pred) > 0
    assert np.allclose(pred["p"], np.where(pred["position_bucket"] == 0, pred["p_bucket_0"], pred["p_bucket_1"]))
    path = save_model(teacher, str(tmp_path / "teacher.pt"))
    pred2 = predict(load_model(path), samples_dir)
    assert np.allclose(pred["p"], pred2["p"], atol=1e-6)
    # student with cached teacher probabilities: KD term active, warm start from a saved student
    probs = pred[["impression_id", "p"]]
    res = train_student(samples_dir, probs, tiny_student(), _tc(max_steps=3))
    assert all("kd" in h and np.isfinite(h["kd"]) for h in res.history)
    spath = save_model(res.model, str(tmp_path / "student.pt"))
    res2 = train_student(samples_dir, probs, tiny_student(), _tc(max_steps=1, lr=0.0), init_from=spath)
    assert np.allclose(predict(res2.model, samples_dir)["p"], predict(res.model, samples_dir)["p"], atol=1e-6)
    m = evaluate(res.model, samples_dir)
    for k in ("auc", "gauc", "logloss", "bucket0_calibration", "tokens_per_s", "len_before_avg", "len_after_p90"):
        assert k in m


def test_main_head_gradient_ignores_teacher_probabilities(samples_dir):
    cfg = tiny_student()
    model = Student(cfg)
    b = collate(next(iter(PackedLoader(samples_dir, "student", cfg, 300, seed=0))))

    def grads(p_value):
        model.zero_grad()
        tg = b.target_tensors("cpu")
        tg["teacher_p"] = torch.full_like(tg["teacher_p"], p_value)
        out = model(b, serving=False)
        loss = sum(w * s for s, _, w in model.loss_sums(out, tg).values())
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    g1, g2 = grads(0.1), grads(0.9)
    for n in g1:
        if n.startswith("main_head"):
            assert torch.allclose(g1[n], g2[n]), n  # labels only
    assert any(not torch.allclose(g1[n], g2[n]) for n in g1 if n.startswith("distill_head"))


# ----------------------------------------------------------------------------- leakage (end to end)

def test_teacher_target_never_depends_on_events_inside_the_delay(samples_dir):
    cfg = tiny_teacher(backbone=dict(n_layers=3))
    model = Teacher(cfg).eval()
    b = collate(next(iter(PackedLoader(samples_dir, "teacher", cfg, 400, seed=None))))
    t = b.tensors
    tgt = torch.nonzero(t["is_target"]).flatten()
    q = int(tgt[len(tgt) // 2])
    seq = seq_index(t["offsets"])
    delay = cfg.mask.delay_ms
    late = (seq == seq[q]) & (t["ts"] > t["ts"][q] - delay)
    late[q] = False
    early = (seq == seq[q]) & (t["ts"] <= t["ts"][q] - delay)
    assert late.any() and early.any()
    row = int((torch.nonzero(t["is_target"]).flatten() == q).nonzero())
    with torch.no_grad():
        base = model(b)["logits"][row]
        t2 = dict(t)
        t2["feats"] = t["feats"].clone()
        t2["feats"][late, 0] = (t["feats"][late, 0] + 17) % 512   # change the items of every too-recent event
        t2["feats"][late, 8] = 6 - t["feats"][late, 8].clamp(max=6)  # and their outcomes
        pert = model(type(b)(b.kind, b.targets, b.n_events, t2))["logits"][row]
        assert torch.allclose(base, pert, atol=1e-6)
        t3 = dict(t)
        t3["feats"] = t["feats"].clone()
        t3["feats"][early, 0] = (t["feats"][early, 0] + 17) % 512
        assert not torch.allclose(base, model(type(b)(b.kind, b.targets, b.n_events, t3))["logits"][row], atol=1e-6)


def test_student_candidate_never_depends_on_other_candidates_or_later_history(samples_dir):
    cfg = tiny_student(backbone=dict(n_layers=4))  # LPTM merges once
    model = Student(cfg).eval()
    b = collate(next(iter(PackedLoader(samples_dir, "student", cfg, 400, seed=None))))
    t = b.tensors
    cseq = seq_index(torch.nn.functional.pad(torch.cumsum(t["cand_len"], 0), (1, 0)))
    hoff = torch.nn.functional.pad(torch.cumsum(t["hist_len"], 0), (1, 0))
    hseq = seq_index(hoff)
    rm = segment_cummax(t["hist_ts"], hseq)
    c = int(torch.argmax(t["cand_ts"] - t["cand_ts"].min() * 0 - (cseq != cseq[0]).long() * 10**15))  # last candidate of sample 0
    cut = int(t["cand_ts"][c]) - cfg.mask.delay_ms
    late_groups = (hseq == cseq[c]) & (rm > cut)
    late_ev = late_groups[t["ev_group"]]
    vis_ev = (~late_groups & (hseq == cseq[c]))[t["ev_group"]]
    others = torch.arange(len(cseq)) != c
    assert vis_ev.any()
    with torch.no_grad():
        base = model(b)["logits"][c]
        t2 = dict(t)
        t2["ev_feats"] = t["ev_feats"].clone()
        t2["ev_feats"][late_ev, 0] = (t["ev_feats"][late_ev, 0] + 5) % 512
        t2["cand_feats"] = t["cand_feats"].clone()
        t2["cand_feats"][others, 0] = (t["cand_feats"][others, 0] + 5) % 512
        pert = model(type(b)(b.kind, b.targets, b.n_events, t2))["logits"][c]
        assert torch.allclose(base, pert, atol=1e-6)
        t3 = dict(t)
        t3["ev_feats"] = t["ev_feats"].clone()
        t3["ev_feats"][vis_ev, 0] = (t["ev_feats"][vis_ev, 0] + 5) % 512
        assert not torch.allclose(base, model(type(b)(b.kind, b.targets, b.n_events, t3))["logits"][c], atol=1e-6)


def test_teacher_probs_from_parquet_join_by_impression_id(samples_dir, tmp_path):
    from models.data import TeacherProbs
    cfg = tiny_student()
    samples = list(iter_samples(samples_dir, cfg.features))
    ids = np.concatenate([s.impression_id[s.is_target] for s in samples])
    probs = pd.DataFrame({"impression_id": ids[::2], "p": np.linspace(0.1, 0.9, len(ids[::2])).astype(np.float32)})
    path = tmp_path / "teacher_logits.parquet"
    probs.to_parquet(path)
    joined = list(iter_samples(samples_dir, cfg.features, teacher=TeacherProbs(str(path))))
    got = pd.Series(np.concatenate([s.teacher_p[s.is_target] for s in joined]),
                    index=np.concatenate([s.impression_id[s.is_target] for s in joined]))
    assert np.allclose(got[probs["impression_id"]].to_numpy(), probs["p"].to_numpy())
    assert got.drop(probs["impression_id"]).isna().all()  # no teacher probability -> NaN -> no KD term
