"""The out-of-time evaluation of yesterday's challenger on day D, as plain functions the
``challenger_evaluation`` asset calls in order:

  score        the challenger and what it is compared with (the registry decides: the champion, the
               challenger itself after its own promotion, or the per-bucket CTR baseline before any
               champion) on D's samples under serving conditions, plus its ONNX graph's parity and latency
  shadow_score the challenger's ONNX graph on the champion's logged requests of D (the prediction log of
               `genrank serve`), rebuilt from the lake as the serving monitor's skew check rebuilds them
  run_gates    deploy.gates.evaluate_gates and shadow_gates on that evaluation
  decide       approved / forced / refused, and why
  record       the decision on the version (tags, model card) and the evaluation's MLflow run
  write_gates  ``gates.json``, which the blocking gate checks read back (read_gates)
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from deploy import registry as reg
from deploy.gates import GateConfig, GateResult, ShadowResult, evaluate_gates, shadow_gates
from deploy.model_card import ctr_card
from deploy.monitoring import lake_requests, parse_log, replayable
from deploy.onnx_export import OnnxScorer, find_bundle, latency_p99_ms, parity
from deploy.reports import calibration_figure, metrics_by_bucket
from transforms.atomic import staged_file


@dataclass
class Evaluation:
    challenger_version: str
    reference_name: str          # what the card and the gate reasons call the reference
    reference_kind: str          # deploy.gates.REFERENCE_KINDS
    challenger_metrics: dict
    reference_metrics: dict
    challenger_pred: pd.DataFrame
    latency_p99_ms: float        # nan: nothing measured
    onnx_max_abs_diff: float     # nan: nothing measured
    shadow: ShadowResult = field(default_factory=lambda: ShadowResult(not_scored="shadow scoring was not run"))


def out_of_time_metrics(pred: pd.DataFrame) -> dict:
    """summarize_predictions of labelled predictions, plus the clicks per position bucket (the calibration
    gate's sample size)."""
    from models.metrics import summarize_predictions

    out = summarize_predictions(pred)
    for k, g in pred.groupby("position_bucket"):
        out[f"bucket{int(k)}_clicks"] = int(g["label"].sum())
    return out


def flat_metrics(prefix: str, metrics: dict) -> dict[str, float]:
    """The finite numbers of ``metrics``, keys prefixed: what MLflow and the registry tags can hold."""
    return {f"{prefix}{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float, np.floating)) and np.isfinite(v)}


def serving_requests(model, samples: Path, n_requests: int) -> list:
    """The first ``n_requests`` user-days of ``samples`` as one request each: the user's history and all
    of the day's impressions as candidates, each at its own time, so the delay mask hides the day's
    newer outcomes (the graph takes per-candidate request times; the service passes one)."""
    from models.data import PackedLoader

    m = getattr(model, "module", model).eval()
    loader = PackedLoader(str(samples), m.kind, m.cfg, token_budget=4 * m.cfg.max_len + 4096, seed=None)
    return [t for toks in loader.iter_epoch(0) for t in toks if len(t.cand_ts)][:n_requests]


def onnx_checks(model, folder: Path, samples: Path, n_requests: int) -> tuple[float, float]:
    """(max |p_onnx - p_torch|, p99 ms) of the version's ONNX graph (downloaded in ``folder``) on day D's
    requests; (nan, nan) for a version logged without one, which the gates then refuse."""
    try:
        bundle = find_bundle(folder)
    except FileNotFoundError:
        return float("nan"), float("nan")
    scorer = OnnxScorer(bundle.onnx, threads=1)
    requests = serving_requests(model, samples, n_requests)
    return parity(model, scorer, requests).max_abs_diff, latency_p99_ms(scorer, requests)


def rank_correlation(served: np.ndarray, shadow: np.ndarray) -> float:
    """Spearman's rho of two score columns over one request's candidates (average ranks for ties); nan when
    it is undefined (fewer than two candidates, or one side's scores all tied)."""
    if len(served) < 2 or np.ptp(served) == 0 or np.ptp(shadow) == 0:
        return float("nan")
    return float(np.corrcoef(pd.Series(served).rank(), pd.Series(shadow).rank())[0, 1])


def compare_shadow(records: list[dict], shadow_scores: list[np.ndarray], latency_ms: float) -> ShadowResult:
    """The challenger's ``shadow_scores`` (per record: candidates x buckets) against the champion's served scores
    of the same logged ``records``: the mean over requests of the per-bucket mean Spearman rho, and per bucket the
    challenger's mean predicted CTR over the champion's served mean."""
    served = [np.asarray(r["scores"], float) for r in records]
    buckets = min(s.shape[1] for s in served)
    per_request = []
    for a, b in zip(served, shadow_scores):
        rhos = [rank_correlation(a[:, k], b[:, k]) for k in range(buckets)]
        if not all(np.isnan(rhos)):
            per_request.append(np.nanmean(rhos))
    both = np.concatenate(served)[:, :buckets], np.concatenate(shadow_scores)[:, :buckets]
    shift = {k: float(both[1][:, k].mean() / both[0][:, k].mean()) for k in range(buckets)}
    return ShadowResult(len(records), len(both[0]), latency_ms,
                        float(np.mean(per_request)) if per_request else float("nan"), len(per_request), shift)


def champion_requests(log_dir: Path | None, day: str, champion_version: str, max_requests: int) -> list[dict]:
    """The first ``max_requests`` (in time order) of the champion's logged requests of ``day`` that were scored
    from the online store (their history can be rebuilt from the lake)."""
    log, _ = parse_log(log_dir, day)
    mine = [x for x in replayable(log.records) if x["model_version"] == champion_version]
    return sorted(mine, key=lambda x: (x["ts_ms"], x["request_id"]))[:max_requests]


def shadow_score(home: Path, r: reg.Registry, challenger_version: str, champion_version: str | None,
                 log_dir: Path | None, day: str, max_requests: int) -> ShadowResult:
    """The challenger on the champion's logged requests of ``day`` (the first ``max_requests`` in time order that
    were scored from the online store: their history is rebuilt from the lake, deploy/monitoring.py): its p99
    scoring time on that request mix and compare_shadow's rank correlation and mean shifts. No model is loaded
    when there is nothing to score."""
    if champion_version is None:
        return ShadowResult(not_scored="no champion yet, so no logged requests to score")
    if champion_version == challenger_version:
        return ShadowResult(not_scored=f"the challenger is the champion v{champion_version} (a rerun after its "
                                       "promotion)")
    mine = champion_requests(log_dir, day, champion_version, max_requests)
    if not mine:
        return ShadowResult(not_scored=f"no logged requests of the champion v{champion_version} on {day}")
    scorer, requests = lake_requests(Path(home), r, reg.CTR, challenger_version, mine)
    return compare_shadow(mine, [scorer.score_tokens(t) for t in requests], latency_p99_ms(scorer, requests))


def score(r: reg.Registry, challenger, champion, samples: Path, baseline: Callable[[], pd.DataFrame],
          latency_requests: int, shadow: ShadowResult) -> Evaluation:
    """Score ``challenger`` (a genrank-ctr model version) and its reference on ``samples``. The reference is
    the registry's answer, never a display string: ``champion`` when there is one (``itself`` when the
    challenger already is the champion), else ``baseline()``'s predictions. ``shadow``: shadow_score's result."""
    from models import load_model, predict

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(str(r.checkpoint(reg.CTR, challenger.version, Path(tmp) / "c")))
        challenger_pred = predict(model, str(samples), with_labels=True)
        challenger_metrics = out_of_time_metrics(challenger_pred)
        onnx_diff, latency = onnx_checks(model, Path(tmp) / "c", samples, latency_requests)
        if champion is not None and champion.version != challenger.version:
            champion_model = load_model(str(r.checkpoint(reg.CTR, champion.version, Path(tmp) / "p")))
            reference = out_of_time_metrics(predict(champion_model, str(samples), with_labels=True))
            name, kind = f"champion v{champion.version}", "champion"
        elif champion is not None:
            reference, name, kind = challenger_metrics, f"champion v{champion.version}", "itself"
        else:
            reference, name, kind = out_of_time_metrics(baseline()), "baseline", "baseline"
    return Evaluation(challenger.version, name, kind, challenger_metrics, reference, challenger_pred, latency, onnx_diff,
                      shadow)


def run_gates(evaluation: Evaluation, cfg: GateConfig) -> list[GateResult]:
    e = evaluation
    return evaluate_gates(e.challenger_metrics, e.reference_metrics, e.reference_name, e.latency_p99_ms,
                          e.onnx_max_abs_diff, cfg, e.reference_kind) + shadow_gates(e.shadow, cfg)


def decide(results: list[GateResult], force: bool) -> tuple[str, str]:
    """(decision, reasons): ``approved`` when every gate passed, else ``forced`` or ``refused``; the reasons
    are the failed gates' (or "all gates passed")."""
    approved = all(g.passed for g in results)
    decision = "approved" if approved else ("forced" if force else "refused")
    return decision, "; ".join(g.reason for g in results if not g.passed) or "all gates passed"


def record(r: reg.Registry, challenger, day: str, evaluation: Evaluation, results: list[GateResult],
           decision: str, reasons: str, forced_by: str | None) -> str:
    """The decision on the challenger's version (tags and model card) and the evaluation's MLflow run
    (both sides' metrics, the gates, per-bucket metrics and the calibration plot); returns the run id.
    ``forced_by`` names who forced a refused challenger through (None unless ``decision`` is forced)."""
    import matplotlib.pyplot as plt

    e = evaluation
    r.tag(reg.CTR, challenger.version, {
        "gate_decision": decision, "gate_reasons": reasons, "evaluated_on": day, "compared_with": e.reference_name,
        **{f"oot_{k}": f"{v:.6f}" for k, v in flat_metrics("", e.challenger_metrics).items()},
        "latency_p99_ms": f"{e.latency_p99_ms:.2f}", "onnx_max_abs_diff": f"{e.onnx_max_abs_diff:.2e}",
    })
    experiment = r.experiment_id(reg.CTR)
    run_id = r.client.create_run(experiment, run_name=f"evaluation-{day}", tags={
        "partition": day, "challenger_version": challenger.version, "decision": decision}).info.run_id
    for k, v in {**flat_metrics("challenger_", e.challenger_metrics), **flat_metrics("reference_", e.reference_metrics)}.items():
        r.client.log_metric(run_id, k, v)
    r.client.log_text(run_id, "\n".join(f"{g.name}: {'pass' if g.passed else 'FAIL'} - {g.reason}" for g in results),
                      "gates.txt")
    r.client.log_dict(run_id, metrics_by_bucket(e.challenger_pred), "metrics_by_bucket.json")
    figure = calibration_figure(e.challenger_pred, f"genrank-ctr v{challenger.version} on {day} (out of time)")
    r.client.log_figure(run_id, figure, "calibration_by_bucket.png")
    plt.close(figure)
    r.client.set_terminated(run_id)
    r.client.update_model_version(reg.CTR, challenger.version, description=ctr_card(
        challenger.version, challenger.tags, day, e.reference_name, e.challenger_metrics, e.reference_metrics, results,
        decision, forced_by, run_id, f"#/experiments/{experiment}/runs/{run_id}", e.shadow))
    return run_id


def write_gates(path: Path, challenger_version: str, forced: bool, results: list[GateResult]) -> None:
    """``gates.json`` of a day, written atomically: the gate checks never read half a decision."""
    with staged_file(path) as staging:
        staging.write_text(json.dumps({"challenger_version": challenger_version, "forced": forced,
                                       "gates": [dataclasses.asdict(g) for g in results]}, indent=1))


def read_gates(path: Path) -> tuple[str, bool, list[GateResult]]:
    """(challenger_version, forced, gate results) as write_gates wrote them."""
    recorded = json.loads(Path(path).read_text())
    return recorded["challenger_version"], bool(recorded["forced"]), [GateResult(**g) for g in recorded["gates"]]
