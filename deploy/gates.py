"""Promotion gates: may yesterday's challenger replace the champion, judged on today's data?

Each gate compares out-of-time metrics (computed under serving conditions on day D) of the
challenger with those of the current champion, or, while there is no champion yet, with the
per-bucket historical-CTR baseline: the first model must beat the baseline's AUC outright (a model
that cannot out-rank position alone has learnt nothing worth serving); every other comparison
allows the same small tolerance whatever the reference. A gate result says what was
compared and why it passed or failed, so the refusal reason reaches the registry and Dagster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deploy.onnx_export import PARITY_TOLERANCE


@dataclass(frozen=True)
class GateConfig:
    auc_tolerance: float = 0.002       # challenger AUC may trail the champion's by this much (noise)
    logloss_tolerance: float = 0.005   # challenger log-loss may exceed the champion's by this much
    # predicted / observed CTR per position bucket, widened by the day's own noise: a bucket passes within
    # [lo - 2 se, hi + 2 se], se the ratio's standard error clustered by user (models.metrics.ratio_se: one
    # user's impressions are not independent, and a few heavy users make a small day's CTR: 5-19 % on the demo
    # world's days). The band is what the daily students of two simulated worlds held on their next day
    # (0.85-1.19 in bucket 0, each within two clustered SEs of [0.9, 1.1] but a cold first model; benchmarks/
    # RESULTS.md "Calibration on the next day"); at production volume se vanishes and the band is the bare one.
    calibration_band: tuple[float, float] = (0.8, 1.25)
    calibration_min_clicks: int = 20   # a bucket with fewer clicks is too noisy to judge
    latency_budget_ms: float = 50.0    # p99 scoring time of one request (CADET: p99 < 50 ms)
    parity_tolerance: float = PARITY_TOLERANCE  # max |p_onnx - p_torch|: the served graph must be the trained model
    # Shadow scoring (the challenger on the champion's logged requests of D, deploy/evaluation.py shadow_score).
    # Rank: Spearman's rho of the two models' scores over a request's candidates, per position bucket, averaged
    # over the requests (per request, not pooled: the auction orders one request's candidates, and a pooled rho
    # is inflated by the spread between users that both models see). A daily retrain re-orders the champion's
    # ranking, it does not overturn it: below 0.5 the challenger would show most requests a different top
    # slate than the evidence it was judged on offline ever saw served; an unrelated model is near 0, a reversed
    # one near -1. The tiny world's next-day candidate (v2) against its champion (v1) on 2026-01-04's 40 replayed
    # requests: 0.91 (tests/test_shadow_scoring.py).
    shadow_rank_floor: float = 0.5
    # Challenger mean / champion served mean of the predicted CTR, per bucket. Two models that both pass the
    # calibration band [0.8, 1.25] against the same traffic stand at most 1.25 / 0.8 apart: [0.64, 1.5625]. A
    # larger move means one of them is miscalibrated on the real request mix, and the auction's bids jump with it.
    # A band on the move alone would refuse a challenger that corrects a miscalibrated champion (the tiny world's
    # v2 moves v1's bucket 1 by 0.73 and its bucket 0 by 1.11).
    shadow_shift_band: tuple[float, float] = (0.8 / 1.25, 1.25 / 0.8)


@dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    observed: float
    threshold: float
    reason: str


@dataclass(frozen=True)
class ShadowResult:
    """The challenger's ONNX graph on the champion's logged requests of D (deploy/evaluation.py shadow_score).
    ``not_scored`` says why nothing was scored (then every other field is empty)."""
    requests: int = 0
    candidates: int = 0
    latency_p99_ms: float = float("nan")
    rank_correlation: float = float("nan")   # mean per-request Spearman rho over the buckets
    ranked_requests: int = 0                  # requests with a defined rho (>= 2 candidates, scores not all tied)
    mean_shift: dict = field(default_factory=dict)   # bucket -> challenger mean / champion served mean
    not_scored: str | None = None


def _fmt(x: float) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _quality_gates(challenger: dict, reference: dict, reference_name: str, first_model: bool,
                   cfg: GateConfig) -> list[GateResult]:
    results = []
    auc_floor = reference["auc"] if first_model else reference["auc"] - cfg.auc_tolerance
    ok = challenger["auc"] > auc_floor if first_model else challenger["auc"] >= auc_floor
    results.append(GateResult(
        "auc", bool(ok), challenger["auc"], auc_floor,
        f"challenger AUC {_fmt(challenger['auc'])} {'>' if first_model else '>='} {reference_name} "
        f"AUC {_fmt(reference['auc'])}{'' if first_model else f' - {cfg.auc_tolerance}'}: {'yes' if ok else 'no'}"))
    # Log-loss gets the same tolerance against the baseline as against a champion: the baseline is
    # calibrated by construction, and on a small day the difference between two calibrated models is noise.
    ll_ceiling = reference["logloss"] + cfg.logloss_tolerance
    ok = challenger["logloss"] <= ll_ceiling
    results.append(GateResult(
        "logloss", bool(ok), challenger["logloss"], ll_ceiling,
        f"challenger log-loss {_fmt(challenger['logloss'])} <= {reference_name} {_fmt(reference['logloss'])}"
        f" + {cfg.logloss_tolerance}: {'yes' if ok else 'no'}"))
    return results


REFERENCE_KINDS = ("champion", "baseline", "itself")


def evaluate_gates(challenger: dict, reference: dict, reference_name: str, latency_p99_ms: float,
                   onnx_max_abs_diff: float, cfg: GateConfig = GateConfig(),
                   reference_kind: str = "champion") -> list[GateResult]:
    """``reference`` holds the metrics the challenger is compared with; ``reference_kind`` says what it is,
    as the registry decides it: the current ``champion``, the per-bucket CTR ``baseline`` (no champion yet:
    the first model must beat it outright), or ``itself`` (the challenger is already the champion: a rerun
    after its promotion, so AUC and log-loss compare nothing and say so). ``latency_p99_ms`` and
    ``onnx_max_abs_diff`` are measured on the challenger's ONNX graph: nan when nothing was measured (no
    graph, or no request with candidates), which fails both gates with that reason."""
    if reference_kind not in REFERENCE_KINDS:
        raise ValueError(f"reference_kind {reference_kind!r}: one of {', '.join(REFERENCE_KINDS)}")
    if reference_kind == "itself":
        note = (f"the challenger is {reference_name}: a rerun after its promotion compares the model with itself, "
                "nothing to judge (its decision stands)")
        results = [GateResult("auc", True, challenger["auc"], reference["auc"], note),
                   GateResult("logloss", True, challenger["logloss"], reference["logloss"], note)]
    else:
        results = _quality_gates(challenger, reference, reference_name, reference_kind == "baseline", cfg)
    lo, hi = cfg.calibration_band
    bad, judged = [], []
    k = 0
    while f"bucket{k}_calibration" in challenger:
        ratio, se = challenger[f"bucket{k}_calibration"], challenger[f"bucket{k}_calibration_se"]
        clicks = challenger[f"bucket{k}_clicks"]
        if clicks >= cfg.calibration_min_clicks and math.isfinite(se):
            low, high = lo - 2.0 * se, hi + 2.0 * se
            said = f"bucket {k}: {_fmt(ratio)} (allowed [{low:.3f}, {high:.3f}]: 2 SE = {2 * se:.3f} at {int(clicks)} clicks)"
            (judged if low <= ratio <= high else bad).append(said)
        k += 1
    if bad:
        reason = f"predicted/observed CTR outside [{lo}, {hi}] widened by 2 user-clustered SE in " + ", ".join(bad)
    elif judged:
        reason = (f"inside [{lo}, {hi}] widened by 2 user-clustered SE, every bucket with >= "
                  f"{cfg.calibration_min_clicks} clicks: " + ", ".join(judged))
    else:
        # Deferred, not failed: on a small or low-CTR day no bucket has the clicks to judge, and refusing
        # every challenger there would freeze the champion. The card and the gate's metadata say so.
        reason = (f"NOT JUDGED: no position bucket reached {cfg.calibration_min_clicks} clicks from two users or "
                  "more; calibration is deferred to a day that has them")
    results.append(GateResult("calibration", not bad, float(len(bad)), 0.0, reason))
    unmeasured = "nothing measured (no ONNX graph, or no request with candidates on the day)"
    ok = onnx_max_abs_diff <= cfg.parity_tolerance
    results.append(GateResult(
        "onnx_parity", bool(ok), onnx_max_abs_diff, cfg.parity_tolerance, unmeasured if math.isnan(onnx_max_abs_diff) else
        f"max |p_onnx - p_torch| {onnx_max_abs_diff:.2e} {'<=' if ok else 'not <='} {cfg.parity_tolerance:.0e}"))
    ok = latency_p99_ms <= cfg.latency_budget_ms
    results.append(GateResult(
        "latency", bool(ok), latency_p99_ms, cfg.latency_budget_ms, unmeasured if math.isnan(latency_p99_ms) else
        f"p99 request scoring (onnxruntime) {latency_p99_ms:.1f} ms {'<=' if ok else 'not <='} budget "
        f"{cfg.latency_budget_ms} ms"))
    return results


SHADOW_GATES = ("shadow_latency", "shadow_rank", "shadow_calibration_shift")


def shadow_gates(shadow: ShadowResult, cfg: GateConfig = GateConfig()) -> list[GateResult]:
    """The gates on the challenger's shadow scoring. Not shadow-scored (no logged request of the champion on D:
    nothing was served, as in every simulated run) passes the three with that reason. A rank correlation that
    no request could define (single candidates, tied scores) is not judged and says so."""
    if shadow.not_scored:
        reason = f"not shadow-scored: {shadow.not_scored}"
        return [GateResult(name, True, float("nan"), float("nan"), reason) for name in SHADOW_GATES]
    on = f"on {shadow.requests} logged requests of the champion ({shadow.candidates} candidates)"
    latency = shadow.latency_p99_ms
    ok = latency <= cfg.latency_budget_ms
    results = [GateResult(
        "shadow_latency", bool(ok), latency, cfg.latency_budget_ms,
        f"nothing timed {on}" if math.isnan(latency) else
        f"p99 request scoring (onnxruntime) {latency:.1f} ms {on} {'<=' if ok else 'not <='} budget "
        f"{cfg.latency_budget_ms} ms")]
    rho, floor = shadow.rank_correlation, cfg.shadow_rank_floor
    if math.isnan(rho):
        results.append(GateResult("shadow_rank", True, rho, floor, f"NOT JUDGED: no request {on} has two "
                                  "candidates with distinct scores to rank"))
    else:
        ok = rho >= floor
        results.append(GateResult(
            "shadow_rank", bool(ok), rho, floor,
            f"mean per-request Spearman rho with the champion's served scores {rho:.4f} over "
            f"{shadow.ranked_requests} ranked requests {on} {'>=' if ok else 'not >='} {floor}"))
    lo, hi = cfg.shadow_shift_band
    shifts = ", ".join(f"bucket {b}: {_fmt(r)}" for b, r in sorted(shadow.mean_shift.items()))
    bad = [b for b, r in shadow.mean_shift.items() if not lo <= r <= hi]
    worst = max(shadow.mean_shift.values(), key=lambda r: abs(math.log(r)) if r > 0 else math.inf, default=1.0)
    results.append(GateResult(
        "shadow_calibration_shift", not bad, worst, lo if worst < 1 else hi,
        f"challenger / champion mean predicted CTR {on} {'outside' if bad else 'inside'} [{lo}, {hi}]: {shifts}"))
    return results


def teacher_gate(teacher_auc: float, reference_auc: float, teacher_name: str, reference_name: str) -> GateResult:
    """May the teacher's cached probabilities be the student's KD targets? Only when the teacher out-ranks what
    serves (the champion, or before the first one the per-bucket CTR baseline) on the day's held-out slice: a
    teacher below the model it should teach would pull the student towards worse rankings (TM20K distils a
    teacher that is better by construction; a first teacher trained on two days is often not). An AUC that
    cannot be computed (one class in the slice) refuses: nothing shows the teacher is better."""
    ok = math.isfinite(teacher_auc) and math.isfinite(reference_auc) and teacher_auc > reference_auc
    return GateResult("teacher", bool(ok), teacher_auc, reference_auc,
                      f"{teacher_name} AUC {_fmt(teacher_auc)} > {reference_name} AUC {_fmt(reference_auc)} on the "
                      f"day's held-out slice: {'yes' if ok else 'no'}")

