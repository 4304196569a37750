"""Model cards: the Markdown description of a registry version, written when what a reviewer needs is
known (MLflow renders a version's description as Markdown on its page).

A ``genrank-ctr`` card is rewritten once the version's gate decision is known: data window, teacher,
code version, the out-of-time metrics against the reference it was compared with, its shadow scoring on the
champion's logged requests of the day (or why there was none), every gate's value, threshold and verdict, the decision and who or what forced it, and the evaluation run with its plots.
A ``genrank-teacher`` card lists the out-of-time AUC of its cached logits per day as they are made.
"""

from __future__ import annotations

import math
from typing import Mapping

from deploy.gates import GateResult, ShadowResult


def _num(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.2e}"
    return str(value)


def ctr_card(version: str, tags: Mapping[str, str], day: str, reference_name: str, challenger: Mapping[str, float],
             reference: Mapping[str, float], gates: list[GateResult], decision: str, forced_by: str | None,
             evaluation_run: str, evaluation_link: str, shadow: ShadowResult | None = None) -> str:
    """The card of a genrank-ctr version judged on ``day`` (the day after the one it was trained on); ``shadow``:
    its shadow scoring (None: none was run)."""
    buckets = sorted({k.split("_")[0] for k in challenger if k.startswith("bucket") and k.endswith("_calibration")})
    rows = [("AUC", "auc"), ("GAUC (per user)", "gauc"), ("log-loss", "logloss")]
    rows += [row for b in buckets for row in ((f"{b} predicted/observed CTR", f"{b}_calibration"),
                                              (f"{b} its standard error (clustered by user)", f"{b}_calibration_se"))]
    lines = [
        f"### genrank-ctr v{version}: {decision} on {day}",
        "",
        f"- **Trained on** training_samples {tags.get('partition', '?')} (data window {tags.get('data_window', '?')})",
        f"- **Distillation** {tags.get('kd', '?')}; **code version** {tags.get('code_version', '?')}",
        f"- **Judged** out of time on {day} (serving conditions) against **{reference_name}**",
        "",
        "| metric | this version | reference |",
        "|---|---|---|",
        *[f"| {label} | {_num(challenger.get(key))} | {_num(reference.get(key))} |" for label, key in rows],
        "",
        *shadow_section(shadow),
        "",
        "| gate | value | threshold | verdict |",
        "|---|---|---|---|",
        *[f"| {g.name} | {_num(float(g.observed))} | {_num(float(g.threshold))} | {'pass' if g.passed else 'FAIL'}: "
          f"{g.reason.replace('|', chr(92) + '|')} |" for g in gates],
        "",
        f"**Decision: {decision}**" + (f", forced by {forced_by}" if forced_by else
                                        ", by the gates" if decision == "refused" else ", every gate passed"),
        "",
        f"Evaluation run [{evaluation_run}]({evaluation_link}): calibration_by_bucket.png, "
        "metrics_by_bucket.json, gates.txt.",
    ]
    return "\n".join(lines)


def shadow_section(shadow: ShadowResult | None) -> list[str]:
    """The card's "Shadow scoring" lines: the challenger on the champion's logged requests of the day."""
    head = ["#### Shadow scoring", ""]
    if shadow is None or shadow.not_scored:
        return head + [f"Not shadow-scored: {shadow.not_scored if shadow else 'shadow scoring was not run'}."]
    return head + [
        f"This version's ONNX graph on {shadow.requests} logged requests of the champion ({shadow.candidates} "
        "candidates), each rebuilt from the lake as the service saw it:",
        "",
        f"- **p99 scoring time** {_num(shadow.latency_p99_ms)} ms",
        f"- **rank correlation** with the champion's served scores (mean per-request Spearman rho) "
        f"{_num(shadow.rank_correlation)} over {shadow.ranked_requests} requests",
        "- **mean predicted CTR, this version / the champion's served** "
        + ", ".join(f"bucket {b} {_num(r)}" for b, r in sorted(shadow.mean_shift.items())),
    ]


def teacher_card(version: str, window: str, code_version: str, auc_by_day: Mapping[str, float], run_link: str) -> str:
    """The card of a genrank-teacher version: its window and the AUC of its cached logits, per day."""
    lines = [
        f"### genrank-teacher v{version}",
        "",
        f"Full-token CADET-style teacher trained on training_samples {window}; code version {code_version}. "
        "Its cached probabilities distil the student.",
        "",
        "| day | out-of-time AUC of its cached logits |",
        "|---|---|",
        *[f"| {day} | {_num(a)} |" for day, a in sorted(auc_by_day.items())],
        "",
        f"Training run: [{run_link.rsplit('/', 1)[-1]}]({run_link})",
    ]
    return "\n".join(lines)
