"""Evaluation metrics: AUC, GAUC, log-loss, per-bucket calibration, throughput, memory, lengths."""
from __future__ import annotations

import resource
import time
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch


def auc(label, score) -> float:
    """ROC AUC via the rank-sum statistic (ties get average ranks). nan if one class is missing."""
    y = np.asarray(label, dtype=np.float64)
    s = np.asarray(score, dtype=np.float64)
    n1 = y.sum()
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = pd.Series(s).rank(method="average").to_numpy()
    return float((r[y > 0.5].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def gauc(user, label, score) -> float:
    """Per-user AUC weighted by the user's impression count (users with one class skipped)."""
    df = pd.DataFrame({"u": np.asarray(user), "y": np.asarray(label, float), "s": np.asarray(score, float)})
    num = den = 0.0
    for _, g in df.groupby("u", sort=False):
        a = auc(g["y"].to_numpy(), g["s"].to_numpy())
        if not np.isnan(a):
            num += a * len(g)
            den += len(g)
    return float(num / den) if den else float("nan")


def log_loss(label, p, eps: float = 1e-7) -> float:
    y = np.asarray(label, np.float64)
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()) if len(y) else float("nan")


def calibration_by_bucket(bucket, label, p, user=None) -> pd.DataFrame:
    """Per position bucket: n, observed CTR, mean predicted CTR, ratio predicted/observed and, given the
    impressions' ``user``, the ratio's standard error clustered by user (``calibration_se``)."""
    df = pd.DataFrame({"bucket": np.asarray(bucket), "y": np.asarray(label, float), "p": np.asarray(p, float)})
    g = df.groupby("bucket").agg(n=("y", "size"), observed_ctr=("y", "mean"), predicted_ctr=("p", "mean")).reset_index()
    g["calibration"] = g["predicted_ctr"] / g["observed_ctr"].replace(0, np.nan)
    if user is not None:
        df["user"] = np.asarray(user)
        g["calibration_se"] = [ratio_se(b["p"], b["y"], b["user"]) for _, b in df.groupby("bucket")]
    return g


def ratio_se(p, y, user) -> float:
    """Standard error of sum(p) / sum(y) with the impressions clustered by user (the delta method's sandwich
    estimate). One user's impressions are not independent: a few heavy users make a day's CTR, so the
    binomial error of the clicks alone understates the noise (1-2.5x on the demo world's days). nan with
    no click or fewer than two users."""
    df = pd.DataFrame({"p": np.asarray(p, float), "y": np.asarray(y, float), "u": np.asarray(user)})
    per_user = df.groupby("u").agg(p=("p", "sum"), y=("y", "sum"))
    clicks, n = per_user["y"].sum(), len(per_user)
    if clicks <= 0 or n < 2:
        return float("nan")
    ratio = per_user["p"].sum() / clicks
    return float(np.sqrt(n / (n - 1) * ((per_user["p"] - ratio * per_user["y"]) ** 2).sum()) / clicks)


def summarize_predictions(pred: pd.DataFrame, label_col: str = "label") -> dict:
    """Metrics of a predict() frame joined with labels (columns user_id, position_bucket, p, label)."""
    y, p = pred[label_col].to_numpy(), pred["p"].to_numpy()
    out = {"n": int(len(pred)), "auc": auc(y, p), "gauc": gauc(pred["user_id"].to_numpy(), y, p),
           "logloss": log_loss(y, p), "ctr": float(np.mean(y)) if len(y) else float("nan"),
           "mean_p": float(np.mean(p)) if len(p) else float("nan")}
    for _, r in calibration_by_bucket(pred["position_bucket"], y, p, pred["user_id"]).iterrows():
        k = int(r["bucket"])
        out[f"bucket{k}_n"] = int(r["n"])
        out[f"bucket{k}_auc"] = auc(y[pred["position_bucket"].to_numpy() == k], p[pred["position_bucket"].to_numpy() == k])
        out[f"bucket{k}_calibration"] = float(r["calibration"])
        out[f"bucket{k}_calibration_se"] = float(r["calibration_se"])
    return out


def length_stats(lengths) -> dict:
    a = np.asarray(lengths, np.float64)
    if len(a) == 0:
        return {"avg": float("nan"), "p90": float("nan")}
    return {"avg": float(a.mean()), "p90": float(np.percentile(a, 90))}


def effective_lengths(toks) -> dict:
    """Average and p90 history length before/after input merging (student tokens) or token counts (teacher)."""
    if not toks:
        return {}
    if hasattr(toks[0], "n_groups"):
        before = [t.n_events for t in toks]
        after = [t.n_groups for t in toks]
    else:
        before = [t.n_events for t in toks]
        after = [t.n_tokens for t in toks]
    b, a = length_stats(before), length_stats(after)
    return {"len_before_avg": b["avg"], "len_before_p90": b["p90"], "len_after_avg": a["avg"], "len_after_p90": a["p90"]}


class Throughput:
    """Tokens (and events) per second over a run."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.events = 0

    def add(self, tokens: int, events: int = 0):
        self.tokens += int(tokens)
        self.events += int(events)

    def rates(self) -> dict:
        dt = max(1e-9, time.perf_counter() - self.t0)
        return {"tokens_per_s": self.tokens / dt, "events_per_s": self.events / dt, "seconds": dt}


def peak_memory_bytes(device: torch.device | str | None = None) -> int:
    """Peak CUDA memory allocated on a CUDA device, else the process's peak RSS."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@contextmanager
def timed():
    t = {"s": 0.0}
    t0 = time.perf_counter()
    yield t
    t["s"] = time.perf_counter() - t0
