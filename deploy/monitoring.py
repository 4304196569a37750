"""What the service did on day D, checked against what the pipeline expects: skew, drift, live calibration.

``monitor_day`` reads D's prediction log (deploy/prediction_log.py), D's ad requests from the landing
zone (deploy/replay.py's reading of the landing contract) and D's training samples (the labels), and
returns a ``MonitorReport`` of three checks; the ``serving_monitor`` asset (assets/monitoring.py)
turns them into asset checks and metadata.

- **Skew** (ERROR when not met). Every logged request scored from the online store is scored again
  offline: the registry's ONNX graph of the version that served it (the bytes the service verified
  against ``onnx_sha256``), on the history the lake holds for the user as of the store's day
  (``lake/user_sequences`` up to ``store_as_of``, cut at the request's time) and the logged candidates with
  the item statistics published with that day (``deploy.sequence_store.published_items``),
  tokenised by the training code (``models.data.request_tokens``). Served and offline probabilities must
  agree within ``PARITY_TOLERANCE`` (the ONNX/torch parity bound): a larger difference means the
  service saw other features than the lake says (a stale or foreign store, a wrong hash key, another
  graph), which needs a person. Requests with an inline history cannot be replayed offline and are
  counted, not compared. At most ``max_skew_requests`` requests are re-scored (the first, in time order).
- **Drift** (WARN/ERROR). Inputs of D against the reference window: the days the served model was
  trained on (its ``data_window`` tag), else the day before D (what a model serving D was last trained
  on). Features: from D's requests (the landing, so no service is needed) the surface, hour of day, ad
  category and the share of impressions whose ad the window never showed (``new_ads``, one-sided: the
  same share of the window against the days before it is the reference); from the log, when the window
  was logged too, the history length and the served prediction. Measure: the population stability
  index with the usual thresholds, 0.1 (WARN: moderate shift) and 0.25 (ERROR: major shift)
  (Siddiqi, *Credit Risk Scorecards*, 2006; Yurdakul 2018). PSI alone is not enough here: one user's
  impressions are not independent (a session's category targets most of its ads), so on the tiny world
  the category PSI between two days of an unchanged world is 0.4-0.5. A feature therefore drifts only
  when its PSI is also significant (p < ``DRIFT_P``) under a permutation test that shuffles whole
  (user, day) clusters between the window and D.
- **Live calibration** (WARN). Served probability at the impression's real position bucket against D's
  clicks, per bucket: predicted / observed CTR with the user-clustered standard error, judged by the
  promotion gate's band (deploy/gates.py GateConfig: within [lo - 2 se, hi + 2 se], with at least
  ``calibration_min_clicks`` clicks). Served and labelled impressions join on (request id, ad id, the
  ad's rank among the request's equal ad ids).

A day without a prediction log is "not served": skew and calibration pass as skipped, the drift of the
landing inputs is still measured, and no model is loaded.

Prediction-log lines that are cut or malformed are quarantined with a reason (``lake/prediction_log_
quarantine/date=D/quarantined.jsonl``: file, line number, reason, the line) and counted, like landing lines.

Libraries considered (``pip download --no-deps``, 2026-12-03): evidently 0.7.23 (11.7 MB wheel; pulls
litestar, nltk, statsmodels, plotly<6, uvicorn[standard], opentelemetry and a telemetry client), nannyml
0.13.1 (23 MB; lightgbm<4.6, FLAML, kaleido, s3fs/gcsfs, matplotlib, seaborn, a Segment analytics
client), whylogs 1.6.4 (1.9 MB; whylabs-client, protobuf, whylogs-sketching: approximate profiles). None
tests drift on clustered samples, which is what decides a drift here, and each adds a stack the pipeline
does not otherwise need; PSI with a cluster permutation test is a few lines of numpy, so none was taken.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from contracts import layout
from deploy.gates import GateConfig
from deploy.onnx_export import PARITY_TOLERANCE
from deploy.prediction_log import day_of
from deploy.replay import day_requests, landing_version
from transforms.atomic import staged_dir

PSI_WARN, PSI_ERROR = 0.1, 0.25     # Siddiqi 2006: < 0.1 stable, 0.1-0.25 moderate, > 0.25 major shift
DRIFT_P = 0.01                      # a PSI over a threshold counts only when the permutation test rejects
PERMUTATIONS = 199                  # p >= 1/200: enough to reject at DRIFT_P
PSEUDO_COUNT = 0.5                  # per bin: a bin empty on one side gives a large, finite PSI
QUANTILE_BINS = 10                  # numeric features: the window's deciles
QUARANTINE = layout.PREDICTION_LOG_QUARANTINE
LANDING_FEATURES = "monitor_landing_features"   # lake/<this>/date=D/<landing fingerprint>.parquet: landing_impressions
PASS, WARN, ERROR = "pass", "warn", "error"
RECORD_TYPES = {"request_id": str, "ts_ms": int, "history_source": str, "history_events": int,
                "candidates": dict, "model_version": str, "scores": list}


# ------------------------------------------------------------------------------------------ the log

@dataclass
class LogDay:
    records: list[dict]
    lines: int = 0
    quarantined: Counter = field(default_factory=Counter)   # reason -> lines

    @property
    def served(self) -> bool:
        return self.lines > 0


def record_problem(record, day: str) -> str | None:
    """Why a prediction-log line cannot be used (the first rule that applies), or None."""
    if not isinstance(record, dict):
        return "malformed_json"
    if any(k not in record for k in RECORD_TYPES):
        return "missing_key"
    if any(type(record[k]) is not t for k, t in RECORD_TYPES.items()):
        return "bad_type"
    ads = record["candidates"].get("ad_id")
    if not isinstance(ads, list) or not ads or any(
            not isinstance(v, list) or len(v) != len(ads) for v in record["candidates"].values()):
        return "bad_candidates"
    scores = record["scores"]
    if len(scores) != len(ads) or any(not isinstance(row, list) or not row or len(row) != len(scores[0])
                                      or not all(type(p) in (int, float) and 0 <= p <= 1 for p in row)
                                      for row in scores):
        return "bad_scores"
    if day_of(record["ts_ms"]) != day:
        return "wrong_day"
    return None


def parse_log(directory: Path | None, day: str) -> tuple[LogDay, list[dict]]:
    """D's records, and the lines that cannot be used (file, line number, reason, text)."""
    files = sorted(layout.day_dir(directory, day).glob("predictions-*.jsonl")) if directory else []
    out, bad = LogDay([]), []
    for path in files:
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            out.lines += 1
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = None
            problem = record_problem(record, day)
            if problem is None:
                out.records.append(record)
            else:
                out.quarantined[problem] += 1
                bad.append({"file": path.name, "line": number, "reason": problem,
                            "text": line.decode("utf-8", "replace")})
    return out, bad


def read_log(directory: Path | None, day: str, quarantine_root: Path) -> LogDay:
    """D's records; the lines that cannot be used go to ``quarantine_root/date=D`` (replaced on a rerun)."""
    out, bad = parse_log(directory, day)
    target = layout.day_dir(quarantine_root, day)
    if bad or target.exists():
        with staged_dir(target) as staging:
            (staging / "quarantined.jsonl").write_bytes(b"".join(orjson.dumps(b) + b"\n" for b in bad))
    return out


def served_candidates(records: list[dict]) -> pd.DataFrame:
    """One row per logged candidate: request, user, time, version, history length, ad, its rank among the
    request's equal ad ids, and the served probability per bucket (``p0..pK-1``)."""
    rows = []
    for r in records:
        for i, (ad, probs) in enumerate(zip(r["candidates"]["ad_id"], r["scores"])):
            rows.append((r["request_id"], str(r.get("user_id")), r["ts_ms"], r["model_version"],
                         r["history_events"], str(ad), i, *probs))
    k = max((len(r["scores"][0]) for r in records), default=0)
    df = pd.DataFrame(rows, columns=["request_id", "user_id", "ts_ms", "model_version", "history_events", "ad_id",
                                     "candidate", *(f"p{b}" for b in range(k))])
    df["ad_rank"] = df.groupby(["request_id", "ad_id"]).cumcount()
    return df


# ------------------------------------------------------------------------------------------ skew

@dataclass
class SkewResult:
    compared_requests: int = 0
    compared_candidates: int = 0
    inline_requests: int = 0                 # inline histories: not replayable offline
    max_abs_diff: float = float("nan")
    by_version: dict = field(default_factory=dict)   # version -> max |diff|
    tolerance: float = PARITY_TOLERANCE

    @property
    def severity(self) -> str:
        return ERROR if self.compared_candidates and not self.max_abs_diff <= self.tolerance else PASS


def replayable(records: list[dict]) -> list[dict]:
    """The records scored from the online store: their history can be rebuilt from the lake (an inline
    history is not logged)."""
    return [r for r in records if r["history_source"] == "store" and r.get("user_id") is not None
            and r.get("store_as_of")]


def lake_requests(home: Path, registry, model_name: str, version: str, records: list[dict]):
    """(the version's ONNX scorer from the registry, each record's request rebuilt from the lake and tokenised
    for that version): the logged candidates on the history the lake holds for the user as of the record's
    store day, cut at its time. ``records`` are ``replayable``."""
    from deploy.event_codec import to_sample
    from deploy.onnx_export import ONNX_FILE, OnnxScorer, find_bundle
    from deploy.sequence_store import _lake_users, candidate_item_stats, partition_files, published_items
    from deploy.service import candidate_events
    from models.data import request_tokens

    folder = home / "monitoring" / "models" / f"{model_name}-v{version}"
    if not any(folder.rglob(ONNX_FILE)):
        with staged_dir(folder) as tmp:
            registry.artifact(model_name, version, tmp, ONNX_FILE)
    bundle = find_bundle(folder)
    cfg = bundle.student_config()
    key = cfg.features.hash_key
    lake = layout.lake(home)
    days = sorted({r["store_as_of"] for r in records})
    available = layout.days_in(layout.dataset(home, layout.USER_SEQUENCES))
    wanted = {str(r["user_id"]) for r in records}
    histories: dict[str, dict] = {}
    items: dict[str, dict] = {}
    for as_of in days:  # each store day's state: the logged users' events of every partition up to it
        files = partition_files(lake, [d for d in available if d <= as_of])
        histories[as_of] = {u: e for u, e in _lake_users(files, key) if u in wanted}
        items[as_of] = published_items(lake, as_of)
    requests = []
    for r in records:
        cand = candidate_events(r["candidates"], r["ts_ms"], key)
        hist = histories[r["store_as_of"]].get(str(r["user_id"]), cand.take(slice(0, 0)))  # none: the lake lacks it
        hist = hist.take(hist.ts <= r["ts_ms"])
        candidates = to_sample(cand, cfg.features)
        if cfg.features.item_stats:   # what the store held for the day: its published item statistics
            found = items[r["store_as_of"]]
            candidates.item_stats, _ = candidate_item_stats(lambda keys: [found.get(k) for k in keys],
                                                            r["candidates"]["ad_id"], r["candidates"]["campaign_id"])
        requests.append(request_tokens(to_sample(hist, cfg.features), candidates, cfg))
    return OnnxScorer(bundle.onnx, threads=1), requests


def offline_scores(home: Path, registry, model_name: str, version: str, records: list[dict]) -> list[np.ndarray]:
    """The version's ONNX graph from the registry on each record's request rebuilt from the lake."""
    scorer, requests = lake_requests(home, registry, model_name, version, records)
    return [scorer.score_tokens(t) for t in requests]


def skew(home: Path, registry, model_name: str, records: list[dict], max_requests: int) -> SkewResult:
    result = SkewResult()
    stored = replayable(records)
    result.inline_requests = len(records) - len(stored)
    stored = sorted(stored, key=lambda r: (r["ts_ms"], r["request_id"]))[:max_requests]
    for version in sorted({r["model_version"] for r in stored}):
        mine = [r for r in stored if r["model_version"] == version]
        worst = 0.0
        for r, offline in zip(mine, offline_scores(home, registry, model_name, version, mine)):
            worst = max(worst, float(np.abs(np.asarray(r["scores"]) - offline).max()))
            result.compared_candidates += len(r["scores"])
        result.by_version[version] = worst
        result.compared_requests += len(mine)
    if result.by_version:
        result.max_abs_diff = max(result.by_version.values())
    return result


# ------------------------------------------------------------------------------------------ drift

@dataclass
class FeatureDrift:
    feature: str
    psi: float
    p_value: float
    n_reference: int
    n_current: int
    skipped: str | None = None   # why it was not measured

    @property
    def severity(self) -> str:
        if self.skipped or not self.p_value < DRIFT_P:
            return PASS
        return ERROR if self.psi >= PSI_ERROR else WARN if self.psi >= PSI_WARN else PASS


def psi(reference: np.ndarray, current: np.ndarray) -> float:
    """Population stability index of two count vectors over the same bins (PSEUDO_COUNT added per bin)."""
    p = (reference + PSEUDO_COUNT) / (reference.sum() + PSEUDO_COUNT * len(reference))
    q = (current + PSEUDO_COUNT) / (current.sum() + PSEUDO_COUNT * len(current))
    return float(((q - p) * np.log(q / p)).sum())


def cluster_drift(name: str, bins: np.ndarray, cluster: np.ndarray, is_current: np.ndarray,
                  one_sided_bin: int | None = None, seed: int = 0) -> FeatureDrift:
    """PSI of the current rows' bins against the reference rows', and its permutation p-value with whole
    clusters (user, day) shuffled between the two sides. ``one_sided_bin``: only a larger share of that bin
    in the current rows counts as drift (the statistic is 0 otherwise)."""
    n_ref, n_cur = int((~is_current).sum()), int(is_current.sum())
    if not n_ref or not n_cur:
        return FeatureDrift(name, float("nan"), float("nan"), n_ref, n_cur,
                            skipped="no reference rows" if not n_ref else "no current rows")
    bin_codes, bin_index = np.unique(bins, return_inverse=True)
    clusters, cluster_index = np.unique(cluster, return_inverse=True)
    counts = np.zeros((len(clusters), len(bin_codes)))
    np.add.at(counts, (cluster_index, bin_index), 1)
    side = np.zeros(len(clusters), bool)
    side[cluster_index[is_current]] = True   # a cluster is one (user, day): wholly on one side
    total = counts.sum(0)

    def statistic(current_side: np.ndarray) -> float:
        cur = counts[current_side].sum(0)
        ref = total - cur
        if one_sided_bin is not None:
            k = int(np.searchsorted(bin_codes, one_sided_bin))
            if k >= len(bin_codes) or bin_codes[k] != one_sided_bin or cur[k] / cur.sum() <= ref[k] / ref.sum():
                return 0.0
        return psi(ref, cur)

    observed = statistic(side)
    rng = np.random.default_rng(seed)
    exceed = sum(statistic(rng.permutation(side)) >= observed for _ in range(PERMUTATIONS))
    return FeatureDrift(name, observed, (1 + exceed) / (1 + PERMUTATIONS), n_ref, n_cur)


def quantile_bins(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, QUANTILE_BINS + 1)[1:-1]))
    return np.searchsorted(edges, values, side="right")


def landing_impressions(home: Path, day: str) -> pd.DataFrame:
    """D's ad requests as the ad server sent them (the landing contract's reading): one row per impression.

    Parsed once per version of the landing day and kept as Parquet under the day's landing fingerprint (a day
    landed again gets a new one): the drift's reference window grows with the served versions' data windows, and
    re-parsing its gzip JSON every day made serving_monitor grow 11 -> 42 s over four days of the `large` world."""
    folder = layout.partition(home, LANDING_FEATURES, day)
    kept = folder / f"{landing_version(home, day)}.parquet"
    if kept.exists():
        return pd.read_parquet(kept)
    frame = _parse_landing_impressions(home, day)
    with staged_dir(folder) as staging:
        frame.to_parquet(staging / kept.name, index=False)
    return frame


def _parse_landing_impressions(home: Path, day: str) -> pd.DataFrame:
    rows = []
    for body in day_requests(home, day).bodies:
        r = orjson.loads(body)
        hour = int(r["request_ts_ms"] // 3_600_000 % 24)
        rows.extend((day, r["user_id"], r["request_id"], hour, c["surface"], c["category_id"], c["ad_id"])
                    for c in r["candidates"])
    return pd.DataFrame(rows, columns=["day", "user_id", "request_id", "hour", "surface", "category_id", "ad_id"])


def _shift(day: str, days: int) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=days)).isoformat()


def with_new_ads(frame: pd.DataFrame, before: set[str]) -> np.ndarray:
    return (~frame["ad_id"].isin(before)).to_numpy().astype(int)


def input_drift(home: Path, day: str, reference: list[str], landed: set[str]) -> list[FeatureDrift]:
    """The landing features of D against the reference days (those of them in ``landed``, the complete
    landing days)."""
    reference = [d for d in reference if d in landed]
    current = landing_impressions(home, day)
    if not reference:
        return [FeatureDrift(f, float("nan"), float("nan"), 0, len(current), skipped="no reference day landed")
                for f in ("surface", "hour", "category_id", "new_ads")]
    ref = pd.concat([landing_impressions(home, d) for d in reference], ignore_index=True)
    both = pd.concat([ref, current], ignore_index=True)
    cluster = (both["user_id"].astype(str) + "|" + both["day"]).to_numpy()
    is_current = (both["day"] == day).to_numpy()
    out = [cluster_drift(f, both[f].astype(str).to_numpy(), cluster, is_current)
           for f in ("surface", "hour", "category_id")]
    # new ads: D's ads the window never showed, against the window's ads that the same span before it never showed
    before = [_shift(reference[0], -len(reference) + i) for i in range(len(reference))]
    before = [d for d in before if d in landed]
    if not before:
        out.append(FeatureDrift("new_ads", float("nan"), float("nan"), len(ref), len(current),
                                skipped="no landed day before the reference window"))
    else:
        seen_before = set(pd.concat([landing_impressions(home, d) for d in before])["ad_id"])
        flags = np.r_[with_new_ads(ref, seen_before), with_new_ads(current, set(ref["ad_id"]))]
        out.append(cluster_drift("new_ads", flags, cluster, is_current, one_sided_bin=1))
    return out


def log_drift(current: pd.DataFrame, reference: pd.DataFrame) -> list[FeatureDrift]:
    """History length and the served prediction (bucket 0's head) against the window's logged requests."""
    if reference.empty or current.empty:
        why = "no logged requests in the reference window" if reference.empty else "no logged requests"
        return [FeatureDrift(f, float("nan"), float("nan"), len(reference), len(current), skipped=why)
                for f in ("history_events", "prediction")]
    both = pd.concat([reference.assign(side=0), current.assign(side=1)], ignore_index=True)
    cluster = (both["user_id"] + "|" + pd.to_datetime(both["ts_ms"], unit="ms").dt.date.astype(str)).to_numpy()
    is_current = (both["side"] == 1).to_numpy()
    return [cluster_drift(f, quantile_bins(both[col].to_numpy(float), reference[col].to_numpy(float)), cluster,
                          is_current)
            for f, col in (("history_events", "history_events"), ("prediction", "p0"))]


# ------------------------------------------------------------------------------------------ calibration

def live_calibration(served: pd.DataFrame, samples_dir: Path, gates: GateConfig = GateConfig()) -> pd.DataFrame:
    """Per position bucket: n, clicks, observed and predicted CTR, their ratio, its clustered se, and
    ``severity`` (WARN outside the gate's band widened by 2 se, with enough clicks)."""
    from models.metrics import calibration_by_bucket

    files = sorted(Path(samples_dir).glob("*.parquet")) if not served.empty else []
    cols = ["request_id", "item_id", "position", "position_bucket", "label", "is_target", "event_kind", "user_id"]
    if not files:
        return pd.DataFrame(columns=["bucket", "n", "clicks", "observed_ctr", "predicted_ctr", "calibration",
                                     "calibration_se", "severity"])
    labelled = pd.concat([pd.read_parquet(f, columns=cols) for f in files], ignore_index=True)
    labelled = labelled[labelled["is_target"] & (labelled["event_kind"] == "impression") & labelled["label"].notna()]
    labelled = labelled.assign(request_id=labelled["request_id"].astype(str), ad_id=labelled["item_id"].astype(str))
    labelled = labelled.sort_values(["request_id", "ad_id", "position"])
    labelled["ad_rank"] = labelled.groupby(["request_id", "ad_id"]).cumcount()
    joined = served.merge(labelled[["request_id", "ad_id", "ad_rank", "position_bucket", "label"]],
                          on=["request_id", "ad_id", "ad_rank"])
    k = sum(c.startswith("p") and c[1:].isdigit() for c in served.columns)
    bucket = joined["position_bucket"].clip(0, k - 1).to_numpy(int)
    p = joined[[f"p{b}" for b in range(k)]].to_numpy()[np.arange(len(joined)), bucket]
    table = calibration_by_bucket(bucket, joined["label"].to_numpy(float), p, joined["user_id"].to_numpy())
    table["clicks"] = table["n"] * table["observed_ctr"]
    lo, hi = gates.calibration_band

    def severity(row) -> str:
        if row["clicks"] < gates.calibration_min_clicks or not math.isfinite(row["calibration_se"]):
            return PASS   # too few clicks to judge, as the promotion gate
        return PASS if lo - 2 * row["calibration_se"] <= row["calibration"] <= hi + 2 * row["calibration_se"] else WARN

    table["severity"] = table.apply(severity, axis=1) if len(table) else []
    return table


# ------------------------------------------------------------------------------------------ the day

@dataclass
class MonitorReport:
    day: str
    log: LogDay
    reference_days: list[str]
    skew: SkewResult
    drift: list[FeatureDrift]
    calibration: pd.DataFrame
    versions: list[str]

    @property
    def served(self) -> bool:
        return self.log.served

    @property
    def drift_severity(self) -> str:
        found = {f.severity for f in self.drift}
        return ERROR if ERROR in found else WARN if WARN in found else PASS

    @property
    def calibration_severity(self) -> str:
        return WARN if (self.calibration["severity"] == WARN).any() else PASS

    def drift_table(self) -> dict:
        return {f.feature: {"psi": None if math.isnan(f.psi) else round(f.psi, 4),
                            "p_value": None if math.isnan(f.p_value) else round(f.p_value, 4),
                            "severity": f.severity, "n_reference": f.n_reference, "n_current": f.n_current,
                            **({"skipped": f.skipped} if f.skipped else {})} for f in self.drift}

    def calibration_table(self) -> list[dict]:
        return json.loads(self.calibration.to_json(orient="records"))


def reference_window(day: str, registry, model_name: str, versions: list[str], default_days: int) -> list[str]:
    """The days the serving versions were trained on (their ``data_window`` tags), else the ``default_days``
    days before D."""
    days: set[str] = set()
    for v in versions:
        window = registry.client.get_model_version(model_name, v).tags.get("data_window", "") if registry else ""
        first, _, last = window.partition("..")
        try:
            a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last or first)
        except ValueError:
            continue
        days.update((a + dt.timedelta(days=i)).isoformat() for i in range((b - a).days + 1))
    days = {d for d in days if d < day}
    return sorted(days) or [_shift(day, -i) for i in range(default_days, 0, -1)]


def monitor_day(home: Path, day: str, landed: set[str], log_dir: Path | None, registry_factory,
                model_name: str = "genrank-ctr", reference_days: int = 1,
                max_skew_requests: int = 500) -> MonitorReport:
    """The three checks of day D (``landed``: the complete landing days). ``registry_factory()`` is called only
    when D was served."""
    home = Path(home)
    log = read_log(log_dir, day, layout.dataset(home, QUARANTINE))
    served = served_candidates(log.records)
    versions = sorted(served["model_version"].unique()) if log.served else []
    registry = registry_factory() if log.records else None
    window = reference_window(day, registry, model_name, versions, reference_days)
    drift = input_drift(home, day, window, landed)
    if not log.served:
        return MonitorReport(day, log, window, SkewResult(), drift, live_calibration(served, home), versions)
    logged_window = [r for d in window for r in parse_log(log_dir, d)[0].records]
    drift += log_drift(served, served_candidates(logged_window))
    return MonitorReport(
        day, log, window, skew(home, registry, model_name, log.records, max_skew_requests), drift,
        live_calibration(served, layout.partition(home, layout.TRAINING_SAMPLES, day)), versions)
