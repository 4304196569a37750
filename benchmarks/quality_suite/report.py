"""The report's markdown: per world, a table of every model's test metrics (mean ± sd over seeds) with the
oracle and baselines, and the paired per-seed differences judged against the seed papers."""
from __future__ import annotations

import math

from benchmarks.quality_suite.variants import ABLATIONS, DAILY, LABELS, LEVERS, PRIVILEGED
from benchmarks.quality_suite.worlds import World

# Seed papers' figures (relative AUC change of the ablated model vs the full one), ../shared/seeds.
SEED_EXPECTATIONS = {
    "no_position_heads": ("CADET", -0.61),
    "no_train_delay": ("CADET", -0.31),
    "index_rope": ("CADET", -0.13),
    # CADET publishes no figure for its self-gate; SORT's attention gate gained 0.21 % CTR-AUC, its QK-norm 0.12 %
    "no_gates": ("SORT (attention gate)", -0.21),
    "no_qk_norm": ("SORT", -0.12),
    "no_litm": ("TM20K", +0.02),   # TM20K: adding LITM costs 0.02 %, so removing it gains as much
    "no_patm": ("TM20K", +0.06),
}

# Levers that a seed paper measured: (its figure, its sign). CADET's table: HSTU 0.8505 AUC, CADET 0.8554.
LEVER_PAPERS = {"hstu": (f"CADET: HSTU {100 * (0.8505 - 0.8554) / 0.8554:+.2f} % rel. (0.8505 vs 0.8554)", -1)}


def _mean_sd(xs) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def _fmt(m: float, sd: float, nd: int = 4) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{nd}f}" + ("" if math.isnan(sd) else f" ± {sd:.{nd}f}")


def _per_seed(results, world, v, seeds, k):
    return [results.get(f"{world.name}|{v}|{s}", {}).get(k, float("nan")) for s in seeds]


def table(world: World, results: dict, seeds: list[int], variants: list[str], extra: dict) -> str:
    b = extra["baseline"]
    lines = [f"#### {world.name}", "",
             f"Train {world.train_days[0]}..{world.train_days[-1]} ({len(world.train_days)} days; the latest "
             f"impressions of {world.train_days[-1]} held out to pick the pass and calibrate), "
             f"out-of-time test {_span(world.eval_days)} ({len(world.eval_days)} day(s): "
             f"{int(b['n']):,} impressions of {_n_users(world):,} users, CTR {b['ctr']:.4f}). "
             f"Mean ± sd over seeds {', '.join(map(str, seeds))}." + (f" {world.note}" if world.note else ""), ""]
    lines += ["| model | AUC | GAUC | log-loss | pred/obs CTR bucket 0 / 1 | history events -> tokens (avg, p90) "
              "| train tokens/s | train events/s | best epoch |", "|---|---|---|---|---|---|---|---|---|"]
    if "oracle" in extra:
        o = extra["oracle"]
        lines.append(f"| oracle, full information | {o['auc_full']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility (nothing newer than 1 h) | {o['auc_serving']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility, each ad's quality as the training days show it | "
                     f"{o['auc_evidence']:.4f} | | | | | | | |")
        lines.append(f"| oracle, serving visibility, no ad quality | {o['auc_no_ad_quality']:.4f} | | | | | | | |")
    lines.append(f"| {LABELS['bucket_ctr']} | {b['auc']:.4f} | {b['gauc']:.4f} | {b['logloss']:.4f} | "
                 f"{_cal(b.get('bucket0_calibration'))} / {_cal(b.get('bucket1_calibration'))} | | | | |")
    for v in variants:
        g = lambda k: _mean_sd(_per_seed(results, world, v, seeds, k))  # noqa: E731
        if math.isnan(g("auc")[0]):
            continue
        epochs = "/".join(str(int(x)) if not math.isnan(x) else "-"
                          for x in _per_seed(results, world, v, seeds, "best_epoch"))
        n = lambda k: "-" if math.isnan(g(k)[0]) else f"{g(k)[0]:,.0f}"  # noqa: E731
        lines.append(
            f"| {LABELS[v]} | {_fmt(*g('auc'))} | {_fmt(*g('gauc'))} | {_fmt(*g('logloss'))} | "
            f"{_cal(g('bucket0_calibration')[0])} / {_cal(g('bucket1_calibration')[0])} | "
            f"{n('len_before_avg')} -> {n('len_after_avg')} ({n('len_before_p90')} -> {n('len_after_p90')}) | "
            f"{n('train_tokens_per_s')} | {n('train_events_per_s')} | {epochs} |")
    lines.append("")
    if "oracle" in extra:
        o = extra["oracle"]
        lines.append(f"Oracle rows: the simulator's p_click / p_click_serving on {o['n']:,} of the {o['n_eval']:,} "
                     f"tested impressions (joined by impression_id, scored against the pipeline's labels); the runner's "
                     f"per-day figure (serving, every logged impression): "
                     + ", ".join(f"{d} {v:.4f}" for d, v in o["runner_auc_serving"].items() if v is not None) + ".")
    if "oracle" in extra:
        for v in [v for v in variants if v == "teacher" or LEVERS.get(v, ("",))[0] == "teacher"]:
            if v in PRIVILEGED:
                gap = [extra["oracle"]["auc_full"] - x for x in _per_seed(results, world, v, seeds, "auc")]
                if not math.isnan(_mean_sd(gap)[0]):
                    lines.append(f"Oracle (full information) - {LABELS[v]}: {_fmt(*_mean_sd(gap))} AUC.")
                continue
            gap = [extra["oracle"]["auc_serving"] - x for x in _per_seed(results, world, v, seeds, "auc")]
            if not math.isnan(_mean_sd(gap)[0]):
                reach = [extra["oracle"]["auc_evidence"] - x for x in _per_seed(results, world, v, seeds, "auc")]
                lines.append(f"Oracle (serving visibility) - {LABELS[v]}: {_fmt(*_mean_sd(gap))} AUC; the same "
                             f"oracle knowing the ads only from the training days - {LABELS[v]}: "
                             f"{_fmt(*_mean_sd(reach))}.")
    if "ads" in extra:
        a = extra["ads"]
        lines.append(f"Ads: {a['seen']:.1%} of the tested impressions show an ad seen in the training days; the "
                     f"{a['ads']:,} ads there had a median of {a['median_impressions']:.0f} training impressions; an "
                     f"ad's training CTR alone (shrunk with {a['prior_weight']:.0f} pseudo-impressions) scores AUC "
                     f"{a['auc']:.4f} on the test day(s).")
    t_in = _mean_sd(_per_seed(results, world, "teacher", seeds, "in_sample_auc"))
    if not math.isnan(t_in[0]):
        lines.append(f"Teacher AUC on its own training days (the KD targets): {_fmt(*t_in)}.")
    lines.append("")
    lines += derived(world, results, seeds, variants)
    return "\n".join(lines)


def _span(days: list[str]) -> str:
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"


def _cal(x) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


def _n_users(world: World) -> int:
    import pyarrow.parquet as pq

    users = set()
    for path in world.samples(world.eval_days):
        t = pq.read_table(path, columns=["user_id", "is_target"])
        users |= set(t.filter(t.column("is_target")).column("user_id").to_pylist())
    return len(users)


def _paired(results, world, a, b, seeds, k="auc"):
    xa, xb = _per_seed(results, world, a, seeds, k), _per_seed(results, world, b, seeds, k)
    return [x - y for x, y in zip(xa, xb) if not (math.isnan(x) or math.isnan(y))]


def _verdict(diffs: list[float], expected: float) -> str:
    """Direction of the paired per-seed differences vs the seed paper's, with 2 standard errors as noise."""
    m, sd = _mean_sd(diffs)
    if math.isnan(m):
        return "-"
    if len(diffs) < 2:
        return ("same sign" if (m > 0) == (expected > 0) else "opposite sign") + " (1 seed: no spread)"
    se = sd / math.sqrt(len(diffs))
    if abs(m) <= 2 * se:
        return f"within seed noise (2 SE = {2 * se:.4f})"
    return ("same direction" if (m > 0) == (expected > 0) else "**opposite direction**") + " (beyond 2 SE)"


def _share(results, world, seeds, v) -> list[float]:
    t, k, n = (_per_seed(results, world, x, seeds, "auc") for x in ("teacher", v, "no_history"))
    return [(kk - nn) / (tt - nn) if abs(tt - nn) > 1e-9 else float("nan") for tt, kk, nn in zip(t, k, n)]


# The paired differences every report prints, when both variants ran: (label, variant, minus variant, the seed
# paper's figure or the issue that asks for it); each is expected positive.
PAIRED_ROWS = (
    ("user history: student (no KD) - no-history student", "student", "no_history",
     "CADET, TM20K: the user sequence is the signal (TM20K: 5K -> 20K events +0.26 % rel.)"),
    ("teacher - no-history student", "teacher", "no_history", "TM20K: the full-token teacher is the upper bound"),
    ("teacher - student (no KD)", "teacher", "student", "TM20K: teacher +0.11 % rel. over the student"),
    ("teacher - trees on the counters", "teacher", "counters_gbdt",
     "issue #18: a sequence model above the counters it is given"),
    ("student (no KD) - trees on the counters", "student", "counters_gbdt",
     "issue #18: a sequence model above the counters it is given"),
    ("student (no KD) - trees on the counters and the served item statistics", "student", "served_gbdt",
     "issue #34 item 5: the peer on what a server holds"),
    ("student with item statistics - trees on the counters and the served item statistics", "item_stats",
     "served_gbdt", "issue #34 item 5: the same inputs, trees against the sequence model"),
    ("no-history student - trees on the ad's CTR and context", "no_history", "ad_gbdt",
     "issue #18: ids learnt as well as the ad's CTR counter"),
    ("KD: student with KD - student without", "student_kd", "student", "TM20K: +0.07 % rel."),
    ("KD from a teacher that did not train on those days - student (no KD)", "student_kd_oot", "student",
     "issue #18: the pipeline's KD targets are out of time"),
    ("the pipeline's daily chain with KD - the same chain without", "student_daily_kd", "student_daily",
     "issue #18: KD that pays, in the pipeline's own protocol"),
    ("the pipeline's daily chain, no KD - student (no KD, every day at once)", "student_daily", "student",
     "issue #18: what warm-started days cost"),
)


def derived(world: World, results: dict, seeds: list[int], variants: list[str]) -> list[str]:
    """Paired per-seed differences (the same seed, data and evaluation; the seed spread is the noise)."""
    rows = []
    ref = _mean_sd(_per_seed(results, world, "student", seeds, "auc"))[0]

    def row(label, a, b, paper, expected):
        d, dg = _paired(results, world, a, b, seeds), _paired(results, world, a, b, seeds, "gauc")
        if not d:
            return
        m = _mean_sd(d)[0]
        rel = f"{100 * m / ref:+.2f} %" if ref and not math.isnan(ref) else "-"
        rows.append(f"| {label} | {_fmt(*_mean_sd(d))} | {rel} | {_fmt(*_mean_sd(dg))} | {paper} | "
                    f"{_verdict(d, expected)} |")

    for label, a, b, paper in PAIRED_ROWS:
        row(label, a, b, paper, +1)
    for v, (kind, _, label, *_) in LEVERS.items():
        base = {"teacher": "teacher", "student": "student"}.get(kind, "student_kd")
        row(f"{label} - {LABELS[base]}", v, base, *LEVER_PAPERS.get(v, ("issue #18 lever", +1)))
        if kind == "kd":
            row(f"{label} - student (no KD)", v, "student", "issue #18: KD that pays", +1)
    row("no cross features - student (no KD)", "no_cross_features", "student",
        "MTGR: -1.25 pp CTR GAUC without its cross features", -1)
    row("item statistics - student (no KD)", "item_stats", "student",
        "issue #34: what trees on the ad's CTR had", +1)
    for v in ABLATIONS:
        if v in variants:
            paper, exp = SEED_EXPECTATIONS[v]
            row(f"{LABELS[v].lstrip('- ')} - student (no KD)", v, "student", f"{paper}: {exp:+.2f} % rel.", exp)
    out = []
    if rows:
        out += ["| paired difference (per seed, then mean ± sd) | AUC | AUC rel. | GAUC | seed paper | here |",
                "|---|---|---|---|---|---|", *rows, ""]
    pct = lambda xs: ", ".join("-" if math.isnan(x) else f"{100 * x:.0f} %" for x in xs)  # noqa: E731
    if all(v in variants for v in ("teacher", "no_history", *DAILY)):
        kd, nokd = _share(results, world, seeds, "student_daily_kd"), _share(results, world, seeds, "student_daily")
        out += [f"The same share for the pipeline's daily chain: with KD {pct(kd)} (mean {100 * _mean_sd(kd)[0]:.0f} %), "
                f"without KD {pct(nokd)} (mean {100 * _mean_sd(nokd)[0]:.0f} %).", ""]
    if all(v in variants for v in ("teacher", "student", "student_kd", "no_history")):
        kd, nokd = _share(results, world, seeds, "student_kd"), _share(results, world, seeds, "student")
        gain = _paired(results, world, "teacher", "no_history", seeds)
        if any(g <= 0 for g in gain):
            out += [f"The teacher does not beat the no-history student on every seed (teacher - no-history: "
                    f"{', '.join(f'{g:+.4f}' for g in gain)}), so the share of its gain a student recovers is not "
                    "meaningful on those seeds; the ratios are printed anyway."]
        out += [f"Share of the teacher's AUC gain over the no-history student that the student recovers, "
                f"(student - no-history) / (teacher - no-history): with KD {pct(kd)} (mean {100 * _mean_sd(kd)[0]:.0f} %), "
                f"without KD {pct(nokd)} (mean {100 * _mean_sd(nokd)[0]:.0f} %), per seed. TM20K: 85 % with KD, "
                f"58 % without (relative to its 5K baseline).", ""]
    return out
