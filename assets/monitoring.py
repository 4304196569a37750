"""serving_monitor: what the service scored on day D against what the pipeline expects (deploy/monitoring.py)."""

import dagster as dg

from deploy import registry as reg
from deploy.monitoring import ERROR, PASS, WARN, monitor_day
from contracts import settings
from assets.partitions import daily_partitions
from assets.resources import GenrankPaths, MlflowResource
from transforms import landing

SEVERITY = {WARN: dg.AssetCheckSeverity.WARN, ERROR: dg.AssetCheckSeverity.ERROR}


class MonitorConfig(dg.Config):
    reference_days: int = 1        # the drift window when the served version has no data_window tag
    max_skew_requests: int = 500   # logged requests re-scored offline (the first of the day)


@dg.asset(
    group_name="monitoring", partitions_def=daily_partitions(), deps=[dg.AssetKey("training_samples")],
    check_specs=[dg.AssetCheckSpec("skew", asset="serving_monitor", blocking=True,
                                   description="served scores equal the registry version's offline scores"),
                 dg.AssetCheckSpec("drift", asset="serving_monitor",
                                   description="PSI of the inputs and predictions against the training window"),
                 dg.AssetCheckSpec("live_calibration", asset="serving_monitor",
                                   description="predicted vs observed CTR per position bucket on D's clicks")],
    description="D's prediction log (genrank serve) joined with D's requests and clicks: skew (ERROR), drift "
                "(WARN/ERROR, PSI 0.1/0.25 when significant), live calibration per bucket (WARN). A day without "
                "a log is 'not served': only the landing inputs' drift is measured, no model is loaded.")
def serving_monitor(context: dg.AssetExecutionContext, paths: GenrankPaths, mlflow: MlflowResource,
                    config: MonitorConfig) -> dg.MaterializeResult:
    day = context.partition_key
    registry = lambda: reg.Registry(mlflow.tracking_uri, paths.root / "mlartifacts")  # noqa: E731 (served days only)
    report = monitor_day(paths.root, day, set(landing.complete_days(paths.root)),
                         settings.serve_prediction_log(paths.root), registry, reference_days=config.reference_days, max_skew_requests=config.max_skew_requests)
    skew, log = report.skew, report.log
    not_served = {"skipped": "not served: no prediction log for the day"} if not report.served else {}
    context.log.info(f"{day}: {'served' if report.served else 'not served'}, {len(log.records)} logged requests "
                     f"({sum(log.quarantined.values())} quarantined), skew max |diff| {skew.max_abs_diff:.2e}, "
                     f"drift {report.drift_severity}, calibration {report.calibration_severity}")

    def check(name: str, severity: str, description: str, metadata: dict) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(check_name=name, passed=severity == PASS, description=description,
                                   severity=SEVERITY.get(severity, dg.AssetCheckSeverity.ERROR),
                                   metadata={**not_served, **metadata})

    drifting = [f"{f.feature} (PSI {f.psi:.3f}, p {f.p_value:.3f})" for f in report.drift if f.severity != PASS]
    return dg.MaterializeResult(
        metadata={
            "served": report.served, "log_lines": log.lines, "logged_requests": len(log.records),
            "quarantined_lines": sum(log.quarantined.values()),
            "quarantined_by_reason": dg.MetadataValue.json(dict(log.quarantined)),
            "model_versions": ", ".join(report.versions) or "none", "reference_days": ", ".join(report.reference_days),
            "skew_max_abs_diff": skew.max_abs_diff, "skew_compared_requests": skew.compared_requests,
            "psi": dg.MetadataValue.json(report.drift_table()),
            "calibration_by_bucket": dg.MetadataValue.json(report.calibration_table()),
        },
        check_results=[
            check("skew", skew.severity,
                  f"max |served - offline| {skew.max_abs_diff:.2e} over {skew.compared_candidates} candidates of "
                  f"{skew.compared_requests} requests (tolerance {skew.tolerance:g}; {skew.inline_requests} inline-"
                  "history requests not replayable)",
                  {"max_abs_diff": skew.max_abs_diff, "compared_requests": skew.compared_requests,
                   "by_version": dg.MetadataValue.json(skew.by_version)}),
            check("drift", report.drift_severity,
                  "drifting: " + ", ".join(drifting) if drifting else "no significant drift over PSI 0.1",
                  {"psi": dg.MetadataValue.json(report.drift_table())}),
            check("live_calibration", report.calibration_severity,
                  "predicted / observed CTR per bucket within the promotion gate's band (2 clustered se)",
                  {"by_bucket": dg.MetadataValue.json(report.calibration_table())}),
        ])
