"""Data reading, overfitting, gradients, checkpoint/resume, prediction, distillation, leakage."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mt_util import tiny_student, tiny_teacher
from models.config import TrainConfig
from models.data import (PackedLoader, collate, hash_ids, iter_file_samples, iter_samples, list_sample_files,
                         observed_ctr, time_holdout)
from models.masks import segment_cummax, seq_index
from models.student import Student
from models.teacher import Teacher
from models.metrics import auc
from models.train import (calibrate, calibrate_on_days, calibration_shifts, evaluate, load_model, predict, save_model,
                          served_head, train_student, train_teacher)


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
    # a teacher's batch holds its whole context (models.config.teacher_context): a 150-token budget, a 150-token teacher
    for kind, cfg in (("teacher", tiny_teacher(max_len=150)), ("student", tiny_student())):
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


def test_time_holdout_splits_the_newest_day_by_time(samples_dir, tmp_path):
    days = sorted(list_sample_files(samples_dir))
    fit_paths, val_paths = time_holdout(samples_dir, 0.3, str(tmp_path))
    assert fit_paths[0] == days[0] and "date=" in fit_paths[-1] and len(fit_paths) == len(days)
    newest, train, val = (pd.read_parquet(p) for p in (days[-1], fit_paths[-1], val_paths[0]))
    targets = newest[newest["is_target"] & (newest["event_kind"] == "impression")]
    cut = val.loc[val["is_target"], "ts_ms"].min()
    assert train["ts_ms"].max() < cut                       # nothing at or after the cut is trained on
    assert set(train.loc[train["is_target"], "impression_id"]) | set(val.loc[val["is_target"], "impression_id"]) \
        == set(targets["impression_id"])                    # every target lands on exactly one side
    assert 0.2 < val["is_target"].sum() / len(targets) < 0.4
    # in the held-out copy the day's earlier impressions are labelled history, as on a next day
    earlier = val[(val["event_kind"] == "impression") & (val["ts_ms"] < cut) & val["label"].notna()]
    assert len(earlier) and not earlier["is_target"].any()


def test_time_holdout_takes_a_file_outside_a_date_folder_as_the_newest_day(samples_dir, tmp_path):
    import shutil

    newest = sorted(list_sample_files(samples_dir))[-1]
    (tmp_path / "loose").mkdir()
    shutil.copy(newest, tmp_path / "loose" / "part-0.parquet")
    fit_paths, val_paths = time_holdout(str(tmp_path / "loose"), 0.3, str(tmp_path / "split"))
    assert len(fit_paths) == 1 and pd.read_parquet(val_paths[0])["is_target"].sum() > 0


def test_time_holdout_copies_the_day_a_row_group_at_a_time_with_its_types(samples_dir, tmp_path):
    """The split copies keep the source's schema (no pandas round trip: int32 positions stay int32, not float)
    and its row groups, so the loader streams them as it streams the day (a `large` day whole as a DataFrame
    was most of a daily student's peak memory)."""
    import pyarrow.parquet as pq

    newest = sorted(list_sample_files(samples_dir))[-1]
    fit_paths, val_paths = time_holdout(samples_dir, 0.3, str(tmp_path))
    source = pq.ParquetFile(newest)
    for path in (fit_paths[-1], val_paths[0]):
        copy = pq.ParquetFile(path)
        assert copy.schema_arrow == source.schema_arrow
        assert copy.num_row_groups > 1
        assert max(copy.metadata.row_group(i).num_rows for i in range(copy.num_row_groups)) \
            <= max(source.metadata.row_group(i).num_rows for i in range(source.num_row_groups))


def test_the_held_out_slice_picks_the_pass_and_the_best_weights_are_kept(samples_dir, tmp_path):
    fit_paths, val_paths = time_holdout(samples_dir, 0.3, str(tmp_path))
    res = train_student(fit_paths, None, tiny_student(), _tc(token_budget=300, epochs=8, patience=2),
                        val_paths=val_paths)
    curve = res.val_curve
    assert 1 <= len(curve) <= 8 and res.best_epoch == int(np.argmax(curve)) + 1
    assert len(curve) == 8 or len(curve) == res.best_epoch + 2   # stopped after `patience` passes without a better one
    assert sorted({h["epoch"] for h in res.history}) == list(range(len(curve)))
    served_head(res.model).calibration.zero_()                   # the kept weights score as the best pass did
    pred = predict(res.model, val_paths, with_labels=True)
    assert auc(pred["label"], pred["p"]) == pytest.approx(max(curve), abs=1e-4)


def test_calibrate_refits_the_served_shift_on_any_held_out_slices(samples_dir, tmp_path):
    """fit's calibration is calibrate() on its held-out slice; calibrate() on more slices (the daily student's
    earlier days) makes the mean prediction the observed CTR of them all, per bucket."""
    fit_paths, val_paths = time_holdout(samples_dir, 0.3, str(tmp_path / "newest"))
    res = train_student(fit_paths, None, tiny_student(), _tc(token_budget=300, epochs=2), val_paths=val_paths)
    fitted = served_head(res.model).calibration.numpy().copy()
    assert np.abs(fitted).max() > 0
    assert np.allclose(calibrate(res.model, val_paths), fitted, atol=1e-5)
    older = sorted(list_sample_files(samples_dir))[-2]
    slices = val_paths + time_holdout(older, 0.3, str(tmp_path / "older"))[1]
    shifts = calibrate(res.model, slices)
    assert np.allclose(served_head(res.model).calibration.numpy(), shifts)
    days = [str(Path(f).parent) for f in sorted(list_sample_files(samples_dir))[-2:]]
    assert np.allclose(calibrate_on_days(res.model, days, 0.3, str(tmp_path / "by-day")), shifts, atol=1e-6)
    pred = predict(res.model, slices, with_labels=True)
    judged = 0
    for k, g in pred.groupby("position_bucket"):
        if g["label"].sum() >= 10:   # calibration_shifts' min_clicks: a bucket with fewer takes the pooled shift
            assert g["p"].mean() == pytest.approx(g["label"].mean(), rel=1e-3)
            judged += 1
    assert judged


def _relabelled(src: str, dst, ctr: float, seed: int = 0) -> str:
    """The samples with every label drawn again at rate ``ctr`` (a world with another base rate)."""
    rng = np.random.default_rng(seed)
    for f in list_sample_files(src):
        df = pd.read_parquet(f)
        imp = df["event_kind"] == "impression"
        df.loc[imp, "label"] = (rng.random(int(imp.sum())) < ctr).astype(np.int8)
        out = dst / f.split("/")[-2]
        out.mkdir(parents=True)
        df.to_parquet(out / "part-0.parquet", index=False)
    return str(dst)


@pytest.mark.parametrize("ctr", [0.03, 0.5])
def test_heads_start_at_the_training_windows_observed_ctr_per_bucket(samples_dir, tmp_path, ctr):
    root = _relabelled(samples_dir, tmp_path / "relabelled", ctr)
    res = train_student(root, None, tiny_student(), _tc(max_steps=0))
    pred = predict(res.model, root, with_labels=True)
    clicks, shown = observed_ctr(root, 2)
    for k in (0, 1):
        assert pred.loc[pred["position_bucket"] == k, "p"].mean() == pytest.approx(clicks[k] / shown[k], rel=0.1)


def test_a_half_clicked_world_trains_calibrated_on_the_next_day(tmp_path):
    """Any base rate: on a world where about half the impressions are clicked, the per-bucket predicted /
    observed CTR on the day after training stays near 1 (the prior and the calibration come from the data)."""
    from models.metrics import summarize_predictions
    from testkit.synthetic_samples import write_training_samples

    write_training_samples(str(tmp_path), n_days=3, n_users=120, noise=0.1, seed=11)
    days = list_sample_files(str(tmp_path))
    res = train_student(days[:2], None, tiny_student(), _tc(token_budget=2048, epochs=6, holdout=0.3))
    pred = predict(res.model, days[2], with_labels=True)
    m = summarize_predictions(pred)
    assert 0.4 < m["ctr"] < 0.7
    for k in (0, 1):
        assert 0.9 <= m[f"bucket{k}_calibration"] <= 1.1, m


def test_calibration_shifts_match_the_observed_rate_per_bucket():
    rng = np.random.default_rng(0)
    z = rng.normal(-1.0, 1.0, 4000)
    bucket = np.repeat([0, 1, 2], [2000, 1990, 10])
    y = (rng.random(4000) < 1 / (1 + np.exp(-(z + np.where(bucket == 0, 0.7, -0.4))))).astype(float)
    pred = pd.DataFrame({"logit": z, "label": y, "position_bucket": bucket})
    d = calibration_shifts(pred, 3, min_clicks=10)
    for k in (0, 1):
        m = bucket == k
        assert (1 / (1 + np.exp(-(z[m] + d[k])))).mean() == pytest.approx(y[m].mean(), rel=1e-4)
    assert abs(d[0] - 0.7) < 0.15 and abs(d[1] + 0.4) < 0.15
    assert d[2] == pytest.approx(calibration_shifts(pred.assign(position_bucket=0), 1)[0])  # too few clicks: pooled


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_checkpoint_resume_gives_the_same_next_step(samples_dir, tmp_path, kind):
    cfg = tiny_teacher(max_len=200) if kind == "teacher" else tiny_student()
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
    assert all(np.isfinite(h["kd"]) and h["kd"] > 0 for h in res.history)
    # without teacher probabilities the term is off: kd = 0 tells the two apart
    alone = train_student(samples_dir, None, tiny_student(), _tc(max_steps=3))
    assert all(h["kd"] == 0 for h in alone.history)
    spath = save_model(res.model, str(tmp_path / "student.pt"))
    res2 = train_student(samples_dir, probs, tiny_student(), _tc(max_steps=1, lr=0.0), init_from=spath)
    assert np.allclose(predict(res2.model, samples_dir)["p"], predict(res.model, samples_dir)["p"], atol=1e-6)
    m = evaluate(res.model, samples_dir)
    scored = predict(res.model, samples_dir, with_labels=True)
    assert m["auc"] == pytest.approx(auc(scored["label"].to_numpy(), scored["p"].to_numpy()))
    assert 0 <= m["gauc"] <= 1 and 0 < m["logloss"] < np.inf and 0 < m["bucket0_calibration"] < np.inf
    assert m["tokens_per_s"] > 0 and m["len_before_avg"] >= 1 and m["len_after_p90"] >= 1


def test_a_failed_save_leaves_no_file_behind(tmp_path, monkeypatch):
    """save_model writes through transforms.atomic.staged_file: a write that fails half-way leaves neither a
    checkpoint nor the partial file (the hand-written temp-then-rename left `<path>.tmp<pid>` behind)."""
    import safetensors.torch

    def half_written(model, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_model", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_model(Student(tiny_student()), str(tmp_path / "student.safetensors"))
    assert list(tmp_path.iterdir()) == []


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


@pytest.mark.parametrize("T", [1.0, 2.5])
def test_kd_is_the_bernoulli_kl_on_logits_divided_by_the_temperature(samples_dir, T):
    import dataclasses

    cfg = dataclasses.replace(tiny_student(), kd_temperature=T)
    model = Student(cfg)
    b = collate(next(iter(PackedLoader(samples_dir, "student", cfg, 300, seed=0))))
    tg = b.target_tensors("cpu")
    tg["teacher_p"] = torch.linspace(0.02, 0.9, len(tg["teacher_p"]))
    with torch.no_grad():
        out = model(b, serving=False)
        kd, n, w = model.loss_sums(out, tg)["kd"]
        zs = out["distill_logits"].gather(1, tg["bucket"].long().clamp(0, 1)[:, None]).squeeze(1) / T
        zt = torch.logit(tg["teacher_p"]) / T
        ps, pt = torch.sigmoid(zs), torch.sigmoid(zt)
        kl = pt * torch.log(pt / ps) + (1 - pt) * torch.log((1 - pt) / (1 - ps))
    assert w == cfg.kd_lambda and int(n) == len(pt)
    assert float(kd) == pytest.approx(float(T * T * kl.sum()), rel=1e-4)


# ----------------------------------------------------------------------------- leakage (end to end)

def _logit_with(model, b, row: int, **changes) -> torch.Tensor:
    """The model's logit at ``row`` on ``b`` with some id columns changed: ``name=[(rows, column, fn), ...]``
    replaces ``b.tensors[name][rows, column]`` by ``fn`` of itself."""
    t = dict(b.tensors)
    for name, edits in changes.items():
        t[name] = t[name].clone()
        for rows, column, fn in edits:
            t[name][rows, column] = fn(t[name][rows, column])
    return model(type(b)(b.kind, b.targets, b.n_events, t))["logits"][row]


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
        item = lambda x: (x + 17) % 512   # noqa: E731
        # the items of every too-recent event, and their outcomes
        pert = _logit_with(model, b, row, feats=[(late, 0, item), (late, 8, lambda x: 6 - x.clamp(max=6))])
        assert torch.allclose(base, pert, atol=1e-6)
        assert not torch.allclose(base, _logit_with(model, b, row, feats=[(early, 0, item)]), atol=1e-6)


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
        item = lambda x: (x + 5) % 512   # noqa: E731
        pert = _logit_with(model, b, c, ev_feats=[(late_ev, 0, item)], cand_feats=[(others, 0, item)])
        assert torch.allclose(base, pert, atol=1e-6)
        assert not torch.allclose(base, _logit_with(model, b, c, ev_feats=[(vis_ev, 0, item)]), atol=1e-6)


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
