"""The dbt-duckdb stage: position CTR and buckets, item/user stats, user_sequences, training_samples.

One dbt invocation per run covers the run's whole partition range (single-run backfills); dbt
tests surface as asset checks. A range that ends before the last built day is extended to it,
because rebuilding day D invalidates every later state (transforms/sequences.py).
"""


import datetime as dt
import importlib.metadata
import json
import os
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import dagster as dg
from dagster_dbt import DagsterDbtTranslator, DbtCliResource, DbtProject, dbt_assets
from packaging import version

from models.config import BackboneConfig
from assets.partitions import daily_partitions, run_partition_days
from assets.resources import GenrankPaths
from quality.framework import to_check_result
from quality.training_samples import TRAINING_SAMPLES_CHECKS, validate_training_samples
from transforms import sequences

dbt_project = DbtProject(project_dir=sequences.DBT_PROJECT_DIR, profiles_dir=sequences.DBT_PROJECT_DIR)
# Parsed before the code location loads (`make setup`, the `genrank` commands, the test session):
# loading it runs no dbt.
MANIFEST = dbt_project.manifest_path
if not MANIFEST.exists():
    raise FileNotFoundError(f"{MANIFEST} is missing: run `make setup` (it parses the dbt project) or "
                            "`python -c 'from transforms.sequences import ensure_manifest; ensure_manifest()'`")


class SequenceTranslator(DagsterDbtTranslator):
    def get_asset_key(self, dbt_resource_props: Mapping[str, Any]) -> dg.AssetKey:
        if dbt_resource_props["resource_type"] == "source":
            return dg.AssetKey(dbt_resource_props["name"])
        return super().get_asset_key(dbt_resource_props)

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return "sequences"


class EnvironmentDbt(DbtCliResource):
    """dagster-dbt's resource for this environment's own dbt executable, less a `dbt --version` per run.

    dagster-dbt asks the executable for its version once per resource instance, and Dagster makes one per run:
    a whole dbt start-up, 4.4 s of a daily sequence step of 17-20 s on 2 cores (2026-12-06). The executable is
    the one installed beside this interpreter (dbt_resource), so its version is the installed dbt-core's;
    tests/test_sequences.py checks that both agree and that dagster-dbt still reads the version there."""

    @cached_property
    def _cli_version(self) -> version.Version:
        return version.parse(importlib.metadata.version("dbt-core"))


def dbt_resource() -> EnvironmentDbt:
    return EnvironmentDbt(project_dir=dbt_project, profiles_dir=sequences.DBT_PROJECT_DIR,
                          dbt_executable=str(Path(sys.executable).with_name("dbt")))


class SequenceBuildConfig(dg.Config):
    """Knobs of the sequence build; dbt_project.yml's vars hold the same defaults for bare dbt runs
    (tests/test_contracts.py checks they agree)."""

    max_seq_len: int = 4096              # events kept per user (TM20K keeps 20K; 4K fits a 2-core CPU)
    n_position_buckets: int = BackboneConfig.n_buckets   # K position buckets: the models' heads (CADET: 2)
    position_ctr_window_days: int = 14   # trailing window of the historical position CTR


@dbt_assets(
    manifest=MANIFEST,
    project=dbt_project,
    partitions_def=daily_partitions(),
    backfill_policy=dg.BackfillPolicy.single_run(),
    dagster_dbt_translator=SequenceTranslator(),
    pool="duckdb",
    name="sequence_models",
)
def sequence_models(context: dg.AssetExecutionContext, dbt: DbtCliResource, paths: GenrankPaths,
                    config: SequenceBuildConfig):
    window = context.partition_time_window
    start = window.start.date().isoformat()
    end = (window.end - dt.timedelta(days=1)).date().isoformat()
    plan = sequences.plan_window(paths.root, start, end)
    if plan.extended:
        context.log.info(f"rebuilding {start}..{end} invalidates later state: extended the window to {plan.end}")
    # The dbt profile and sources read GENRANK_HOME; the subprocess inherits it from here.
    os.environ["GENRANK_HOME"] = str(paths.root)
    events = list(dbt.cli(["build", "--vars", json.dumps(plan.dbt_vars(**config.model_dump()))], context=context).stream())
    exports = [sequences.export_day(paths.root, day) for day in plan.days]
    last = exports[-1]
    extra: dict[str, dict[str, Any]] = {
        "training_samples": {
            "window": f"{plan.start}..{plan.end}",
            "window_extended": plan.extended,
            "samples": sum(e.samples for e in exports),
            "rows": sum(e.sample_rows for e in exports),
            "targets": sum(e.targets for e in exports),
            "target_ctr": sum(e.target_ctr * e.targets for e in exports) / max(sum(e.targets for e in exports), 1),
            "history_len_mean": last.history_mean,
            "history_len_p50": last.history_p50,
            "history_len_p90": last.history_p90,
            "history_len_max": last.history_max,
            "path": dg.MetadataValue.path(last.path),
            "per_day": dg.MetadataValue.json([e.__dict__ for e in exports]),
        },
        "user_sequences": {
            "appended_events": sum(e.appended_events for e in exports),
            "path": dg.MetadataValue.path(str(paths.lake / "user_sequences")),
        },
        "position_buckets": {
            "buckets": dg.MetadataValue.md(_bucket_markdown(sequences.position_bucket_table(paths.root, plan.end))),
        },
    }
    for event in events:
        model = event.output_name.removeprefix("model_genrank_") if isinstance(event, dg.Output) else None
        if model in extra:
            event = event.with_metadata({**event.metadata, **extra[model]})
        yield event


def _bucket_markdown(rows: list[dict]) -> str:
    lines = ["| surface | position | historical CTR | impressions | bucket |", "|---|---|---|---|---|"]
    for r in rows:
        ctr = "-" if r["historical_ctr"] != r["historical_ctr"] or r["historical_ctr"] is None else f"{r['historical_ctr']:.4f}"
        imps = "-" if r["historical_impressions"] != r["historical_impressions"] or r["historical_impressions"] is None else f"{int(r['historical_impressions'])}"
        lines.append(f"| {r['surface']} | {r['position']} | {ctr} | {imps} | {r['position_bucket']} |")
    return "\n".join(lines)


def run_sequence_config(run_config: Mapping[str, Any] | None) -> SequenceBuildConfig:
    """The SequenceBuildConfig the run built with (its run config for sequence_models, else the defaults):
    the checks judge the samples by the settings that made them."""
    ops = (run_config or {}).get("ops", {})
    return SequenceBuildConfig(**ops.get("sequence_models", {}).get("config", {}))


@dg.multi_asset_check(specs=TRAINING_SAMPLES_CHECKS.specs("training_samples"), can_subset=False)
def training_samples_checks(context: dg.AssetCheckExecutionContext, paths: GenrankPaths):
    """GX checks on each exported day of the run: labelled targets, bucket range, no future leakage."""
    outcomes: dict[str, list] = {}
    for day in run_partition_days(context.run.tags):
        for name, outcome in validate_training_samples(
                paths.lake_partition("training_samples", day), day,
                run_sequence_config(context.run.run_config).n_position_buckets).items():
            outcomes.setdefault(name, []).append((day, outcome))
    for check in TRAINING_SAMPLES_CHECKS.checks:
        per_day = outcomes[check.name]
        failed = [(day, o) for day, o in per_day if not o.passed]
        merged = failed[0][1] if failed else per_day[-1][1]
        result = to_check_result("training_samples", check, merged)
        yield dg.AssetCheckResult(
            check_name=check.name, asset_key="training_samples", passed=not failed, severity=result.severity,
            description=(f"{failed[0][0]}: " if failed else "") + (result.description or ""),
            metadata={**result.metadata, "days": dg.MetadataValue.json([d for d, _ in per_day]),
                      "failed_days": dg.MetadataValue.json([d for d, _ in failed])})
