"""Time RoPE, masks in the models (ablation switches), one-pass candidate scoring."""
import dataclasses
import math

import pytest
import torch

from mt_util import tiny_student, tiny_teacher
from models.config import RoPEConfig, YEAR_S
from models.data import PackedLoader, collate, iter_samples, student_tokens
from models.layers import RoPE
from models.student import Student
from models.teacher import Teacher


def test_time_rope_matches_the_cadet_formula():
    cfg = RoPEConfig()  # dt_max 1 year, phi_min 1e-4, base 6e5
    r = RoPE(cfg, head_dim=8)
    t = torch.tensor([YEAR_S], dtype=torch.float64)
    cos, sin = r.angles(t)
    ang = torch.atan2(sin, cos).double()
    expect = [YEAR_S * 1e-4 / YEAR_S * 6e5 ** (2 * i / 8) for i in range(4)]
    # the slowest pair turns phi_min over one year; compare modulo 2 pi
    for a, e in zip(ang[0].tolist(), expect):
        assert math.isclose((a - e + math.pi) % (2 * math.pi) - math.pi, 0.0, abs_tol=1e-4)
    assert expect[0] == pytest.approx(1e-4)


def test_rope_scores_depend_only_on_time_differences():
    r = RoPE(RoPEConfig(base=6e5, dt_max_s=86400.0), head_dim=8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 8, generator=g), torch.randn(2, 1, 8, generator=g)
    t = torch.tensor([100.0, 5000.0], dtype=torch.float64)

    def score(tt):
        cs = r.angles(tt)
        return (RoPE.apply(q, cs)[1] * RoPE.apply(k, cs)[0]).sum()

    assert torch.allclose(score(t), score(t + 12345.0), atol=1e-5)
    assert not torch.allclose(score(t), score(t * 2), atol=1e-4)


def test_rope_modes_change_the_model(samples_dir):
    b = collate(next(iter(PackedLoader(samples_dir, "teacher", tiny_teacher(), 300, seed=None))))
    outs = []
    for mode in ("time", "index", "none"):
        torch.manual_seed(0)
        m = Teacher(tiny_teacher(rope=RoPEConfig(mode=mode))).eval()
        with torch.no_grad():
            outs.append(m(b)["logits"])
    # absolute tolerance: the heads start at the base-rate logit, so relative differences are small
    assert not torch.allclose(outs[0], outs[1], rtol=0, atol=1e-7)
    assert not torch.allclose(outs[0], outs[2], rtol=0, atol=1e-7)


def test_delay_ablation_trains_without_delay_but_serves_with_it(samples_dir):
    from models.config import MaskConfig
    cfg = tiny_teacher(mask=MaskConfig(train_delay=False))
    m = Teacher(cfg)
    b = collate(next(iter(PackedLoader(samples_dir, "teacher", cfg, 300, seed=None))))
    lo_s, hi_s = m.bounds(b, serving=True)
    lo_t, hi_t = m.bounds(b, serving=False)
    tgt = b.tensors["is_target"]
    assert bool((hi_t[tgt] >= hi_s[tgt]).all()) and bool((hi_t[tgt] > hi_s[tgt]).any())
    m2 = Teacher(tiny_teacher())
    assert torch.equal(m2.bounds(b, serving=False)[1], m2.bounds(b, serving=True)[1])


def test_sliding_window_models_run_and_differ(samples_dir):
    from models.config import MaskConfig
    b = collate(next(iter(PackedLoader(samples_dir, "student", tiny_student(), 300, seed=None))))
    torch.manual_seed(0)
    full = Student(tiny_student()).eval()
    torch.manual_seed(0)
    win = Student(tiny_student(mask=MaskConfig(window=2, n_global=1))).eval()
    with torch.no_grad():
        a, w = full(b)["logits"], win(b)["logits"]
    assert torch.isfinite(w).all() and not torch.allclose(a, w, rtol=0, atol=1e-7)  # heads start at the prior logit


def test_one_masked_pass_equals_one_pass_per_candidate(samples_dir):
    cfg = tiny_student(backbone=dict(n_layers=4))
    model = Student(cfg).eval()
    s = max(iter_samples(samples_dir, cfg.features), key=lambda s: int(s.is_target.sum()))
    full = student_tokens(s, cfg.features, cfg.max_len)
    assert len(full.cand_ts) >= 3
    with torch.no_grad():
        one = model(collate([full]))["logits"]
        each = []
        for i in range(len(full.cand_ts)):
            each.append(model(collate([full.with_candidates(slice(i, i + 1))]))["logits"])
    assert torch.allclose(torch.cat(each), one, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny", "demo", "large"])
def test_presets_build(name):
    from models.config import from_dict, preset, to_dict
    from models.config import StudentConfig as SC, TeacherConfig as TC
    t, s, tr = preset(name)
    assert from_dict(TC, to_dict(t)) == t and from_dict(SC, to_dict(s)) == s
    # TM20K: same architecture, fewer tokens (the pipeline's student is also shallower)
    assert dataclasses.replace(s.backbone, n_layers=t.backbone.n_layers) == t.backbone
    if name != "large":
        Teacher(t), Student(s)


def test_id_dropout_nulls_only_the_memorising_ids_and_only_in_training():
    from models import FeatureConfig
    from models.data import ID_FIELDS, N_FIELDS
    from models.layers import TokenEmbedding

    torch.manual_seed(0)
    feats = torch.randint(1, 8, (400, N_FIELDS))  # inside every field's vocabulary
    never, always = TokenEmbedding(FeatureConfig(), 16, 0.0), TokenEmbedding(FeatureConfig(), 16, 1.0)
    always.load_state_dict(never.state_dict())
    without_ids = feats.clone()
    without_ids[:, list(ID_FIELDS)] = 0
    assert torch.equal(always.train()(feats), never(without_ids))
    assert torch.equal(always.eval()(feats), never(feats))  # serving never drops
    half = TokenEmbedding(FeatureConfig(), 16, 0.5)
    half.load_state_dict(never.state_dict())
    out = half.train()(feats)
    dropped = torch.isclose(out, never(without_ids)).all(1)
    kept = torch.isclose(out, never(feats)).all(1)
    assert (dropped ^ kept).all()  # a token loses all three ids or none
    assert 0.35 < dropped.float().mean() < 0.65


def test_a_config_saved_before_the_item_statistics_keeps_scoring_without_them():
    """A registered model's config from before FeatureConfig.item_stats existed loads with them off: its graph's
    cross-feature input has the width it was exported with."""
    from models.config import StudentConfig, from_dict, preset, to_dict
    from models.data import n_counters, n_cross_features

    student = preset("demo")[1]
    with_stats = dataclasses.replace(student, features=dataclasses.replace(student.features, item_stats=True))
    saved = to_dict(with_stats)
    assert saved["features"].pop("item_stats") is True
    old = from_dict(StudentConfig, saved)
    assert not old.features.item_stats and n_cross_features(old.features) == n_counters(old.features)
    assert from_dict(StudentConfig, to_dict(with_stats)).features.item_stats
