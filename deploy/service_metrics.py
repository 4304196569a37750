"""The scoring service's Prometheus metrics (``GET /metrics``, prometheus_client).

    genrank_serve_requests_total{status}                  POST /v1/score answers, by HTTP status
    genrank_serve_errors_total{status,reason}             the refused and failed ones, by kind (deploy/service.py)
    genrank_serve_request_duration_seconds                a scored request's time, body read to response built
    genrank_serve_model_version                           the genrank-ctr version each worker serves
    genrank_serve_store_day_timestamp_seconds             start (UTC) of the newest day each worker's store holds
    genrank_serve_store_staleness_seconds                 seconds since the end of that day (+Inf without a store)
    genrank_serve_prediction_log_records_total            prediction-log records written
    genrank_serve_item_stats_defaulted_total              candidates scored with default item statistics (their
                                                          ad has no record in the store, or no store answered)
    genrank_serve_prediction_log_dropped_total{reason}    records dropped: queue_full, write_error

Several workers (``genrank serve --workers N``) use prometheus_client's multiprocess mode: every worker
writes its values to files under one directory (``PROMETHEUS_MULTIPROC_DIR``, set by ``genrank serve``
before any worker starts: deploy/metrics_dir.py), and whichever worker answers a scrape reads them all,
so counters and the histogram are sums over the workers. The per-worker gauges (model version, store
day) carry a ``pid`` label (mode ``liveall``: a worker that exits cleanly removes its own); staleness is
the largest over live workers (``livemax``), each worker updating its own at every refresh and scrape.
Without a directory (one process, tests) each app keeps its own registry.
"""
from __future__ import annotations

import datetime as dt
import math
import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

DAY_S = 86_400
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServiceMetrics:
    def __init__(self, multiprocess_dir: Path | None = None):
        self.multiprocess_dir = multiprocess_dir
        # multiprocess mode exports every metric the process created: they join no registry
        self._registry = None if multiprocess_dir else CollectorRegistry()
        r = self._registry
        self.requests = Counter("genrank_serve_requests", "POST /v1/score answers, by HTTP status", ["status"],
                                registry=r)
        self.errors = Counter("genrank_serve_errors", "POST /v1/score requests refused or failed, by status and reason",
                              ["status", "reason"], registry=r)
        self.latency = Histogram("genrank_serve_request_duration_seconds",
                                 "Time to answer a scored request, from reading its body to its response",
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.model_version = Gauge("genrank_serve_model_version", "The genrank-ctr version the worker serves",
                                   multiprocess_mode="liveall", registry=r)
        self.store_day = Gauge("genrank_serve_store_day_timestamp_seconds",
                               "Start (UTC) of the newest day the worker's online store holds",
                               multiprocess_mode="liveall", registry=r)
        self.store_staleness = Gauge("genrank_serve_store_staleness_seconds",
                                     "Seconds since the end of the online store's newest day (+Inf without a store)",
                                     multiprocess_mode="livemax", registry=r)
        self.log_written = Counter("genrank_serve_prediction_log_records", "Prediction-log records written",
                                   registry=r)
        self.log_dropped = Counter("genrank_serve_prediction_log_dropped",
                                   "Prediction-log records dropped, by reason (queue_full, write_error)", ["reason"],
                                   registry=r)
        self.stats_defaulted = Counter("genrank_serve_item_stats_defaulted",
                                       "Candidates scored with default item statistics (zero counts): no record "
                                       "of their ad in the online store, or no store to ask", registry=r)

    def item_stats_defaulted(self, n: int) -> None:
        if n:
            self.stats_defaulted.inc(n)

    def answered(self, status: int, reason: str | None = None, seconds: float | None = None) -> None:
        """One POST /v1/score answer: an error's reason, a scored request's time."""
        self.requests.labels(str(status)).inc()
        if reason is not None:
            self.errors.labels(str(status), reason).inc()
        if seconds is not None:
            self.latency.observe(seconds)

    def dropped(self, reason: str, n: int) -> None:
        self.log_dropped.labels(reason).inc(n)

    def written(self, n: int) -> None:
        self.log_written.inc(n)

    def served(self, version: str | None, store_as_of: str | None) -> None:
        """The worker's model version and store day, and the store's staleness now."""
        if version is not None and version.isdigit():
            self.model_version.set(int(version))
        if store_as_of is None:
            self.store_staleness.set(math.inf)
            return
        start = dt.datetime.fromisoformat(store_as_of).replace(tzinfo=dt.timezone.utc).timestamp()
        self.store_day.set(start)
        self.store_staleness.set(time.time() - (start + DAY_S))

    def exposition(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self._registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(self.multiprocess_dir))
        return generate_latest(registry)

    def worker_exited(self) -> None:
        """A worker's clean exit: its per-worker gauges leave the exposition (counters stay in the sums)."""
        if self.multiprocess_dir is not None:
            multiprocess.mark_process_dead(os.getpid(), str(self.multiprocess_dir))
