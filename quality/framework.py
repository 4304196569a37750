"""A small framework: Great Expectations 1.x suites per dataset, turned into Dagster asset checks.

Why not dagster-ge: it pins great-expectations < 1. This module calls GX 1.x directly.

Concepts
--------
* :class:`CheckDef` — one Dagster asset check (static: name, blocking or warning, description).
  A dataset's checks are declared once (:class:`DatasetChecks`), so the asset can declare its
  ``AssetCheckSpec``s at definition time (``DatasetChecks.specs(asset)``); blocking checks get
  ``AssetCheckSpec(blocking=True)`` and, when they fail, severity ERROR (downstream assets of the same
  run do not start); warning checks fail with severity WARN and never block.
* Per partition, a dataset module builds the GX expectations of each check (they depend on the day,
  on trailing figures, on thresholds), tagging each with ``meta={"check": <check name>}``.
  :func:`validate_frame` runs all of them in **one** validation with an ephemeral GX context
  (``gx.get_context(mode="ephemeral")``, a pandas datasource, a whole-dataframe batch), and groups the
  expectation results per check into :class:`CheckOutcome`s.
* Checks that GX cannot express on the data itself (row accounting of the job, quarantine rate)
  are plain Python and produce the same :class:`CheckOutcome` (:func:`python_outcome`).
* :func:`to_check_result` turns an outcome into a ``dagster.AssetCheckResult``: pass/fail, severity,
  a one-line description naming the failing expectation(s) and observed value(s), and metadata
  with, per failing expectation, its type and arguments, the observed value, the unexpected count
  and a sample of offending rows.

Library code: it imports dagster and great_expectations but never any asset.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import dagster as dg  # noqa: E402
import pandas as pd  # noqa: E402

from contracts import layout  # noqa: E402

SAMPLE_ROWS = 5


@dataclass(frozen=True)
class CheckDef:
    name: str
    description: str
    blocking: bool = True


@dataclass(frozen=True)
class DatasetChecks:
    """The static list of asset checks of one dataset."""

    dataset: str
    checks: tuple[CheckDef, ...]

    def names(self) -> list[str]:
        return [c.name for c in self.checks]

    def get(self, name: str) -> CheckDef:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"{self.dataset} has no check {name!r}")

    def specs(self, asset: str | dg.AssetKey) -> list[dg.AssetCheckSpec]:
        return [
            dg.AssetCheckSpec(c.name, asset=asset, blocking=c.blocking,
                              description=("[blocking] " if c.blocking else "[warning] ") + c.description)
            for c in self.checks
        ]


@dataclass
class ExpectationFailure:
    expectation: str
    kwargs: dict[str, Any]
    observed: Any = None
    unexpected_count: int | None = None
    element_count: int | None = None
    sample_values: list[Any] = field(default_factory=list)
    sample_rows: list[dict[str, Any]] = field(default_factory=list)
    message: str | None = None

    def headline(self) -> str:
        if self.message:
            return self.message
        args = ", ".join(f"{k}={_short(v)}" for k, v in self.kwargs.items())
        text = f"{self.expectation}({args})"
        if self.unexpected_count is not None:
            text += f": {self.unexpected_count} of {self.element_count} rows unexpected"
            if self.sample_values:
                text += f", e.g. {_short(self.sample_values[:3])}"
        elif self.observed is not None:
            text += f": observed {_short(self.observed)}"
        return text


@dataclass
class CheckOutcome:
    check: str
    passed: bool
    evaluated: int = 0
    failures: list[ExpectationFailure] = field(default_factory=list)
    description: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        if self.description:
            return self.description
        if self.passed:
            return f"{self.evaluated} expectation(s) passed"
        return "; ".join(f.headline() for f in self.failures)


def _short(v: Any, limit: int = 120) -> str:
    s = json.dumps(_jsonable(v), default=str) if not isinstance(v, str) else v
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            return str(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def ephemeral_context():
    """A throw-away GX context: nothing on disk, no analytics, no progress bars."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    try:
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    except Exception:  # pragma: no cover - cosmetic only
        pass
    return context


def validate_frame(
    df: pd.DataFrame,
    expectations: Mapping[str, Sequence[Any]],
    suite_name: str,
    sample_rows: int = SAMPLE_ROWS,
) -> dict[str, CheckOutcome]:
    """Validate ``df`` against GX expectations grouped by check name; one outcome per check."""
    import great_expectations as gx

    context = ephemeral_context()
    source = context.data_sources.add_pandas(f"{suite_name}_source")
    asset = source.add_dataframe_asset(suite_name)
    batch_def = asset.add_batch_definition_whole_dataframe("partition")
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name))
    for check, exps in expectations.items():
        for exp in exps:
            exp.meta = {**(exp.meta or {}), "check": check}
            suite.add_expectation(exp)
    outcomes = {check: CheckOutcome(check, passed=True) for check in expectations}
    if not any(expectations.values()):
        return outcomes
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": sample_rows})
    for r in result.results:
        cfg = r.expectation_config
        check = (cfg.meta or {}).get("check")
        out = outcomes[check]
        out.evaluated += 1
        if r.success:
            continue
        out.passed = False
        res = dict(r.result or {})
        kwargs = {k: v for k, v in cfg.kwargs.items() if k not in ("batch_id",)}
        failure = ExpectationFailure(
            expectation=cfg.type,
            kwargs=_jsonable(kwargs),
            observed=_jsonable(res.get("observed_value")),
            unexpected_count=res.get("unexpected_count"),
            element_count=res.get("element_count"),
            sample_values=_jsonable(res.get("partial_unexpected_list") or []),
        )
        idx = res.get("partial_unexpected_index_list") or []
        if idx:
            rows = df.loc[[i for i in idx if i in df.index][:sample_rows]]
            failure.sample_rows = _jsonable(rows.to_dict(orient="records"))
        if r.exception_info and r.exception_info.get("raised_exception"):
            failure.message = f"{cfg.type} raised: {r.exception_info.get('exception_message')}"
        out.failures.append(failure)
    return outcomes


def python_outcome(check: str, passed: bool, description: str, metadata: Mapping[str, Any] | None = None,
                   observed: Any = None) -> CheckOutcome:
    """An outcome computed in Python (not by GX), e.g. from the job's row accounting."""
    failures = [] if passed else [ExpectationFailure(expectation=check, kwargs={}, observed=_jsonable(observed),
                                                      message=description)]
    return CheckOutcome(check, passed=passed, evaluated=1, failures=failures, description=description,
                        metadata=dict(metadata or {}))


def to_check_result(asset_key: str | dg.AssetKey, check: CheckDef, outcome: CheckOutcome) -> dg.AssetCheckResult:
    """A Dagster AssetCheckResult for one outcome (ERROR severity if blocking, else WARN)."""
    metadata: dict[str, Any] = {
        "blocking": check.blocking,
        "expectations_evaluated": outcome.evaluated,
        "summary": outcome.summary(),
    }
    if outcome.failures:
        metadata["failing_expectations"] = dg.MetadataValue.json([
            {"expectation": f.expectation, "kwargs": f.kwargs, "observed_value": f.observed,
             "unexpected_count": f.unexpected_count, "element_count": f.element_count,
             "sample_values": f.sample_values, "message": f.message}
            for f in outcome.failures
        ])
        first = outcome.failures[0]
        metadata["failing_expectation"] = first.expectation
        metadata["observed_value"] = _short(first.observed if first.observed is not None else first.unexpected_count)
        rows = [row for f in outcome.failures for row in f.sample_rows][:SAMPLE_ROWS]
        if rows:
            metadata["sample_offending_rows"] = dg.MetadataValue.json(rows)
    for k, v in outcome.metadata.items():
        metadata[k] = dg.MetadataValue.json(_jsonable(v)) if isinstance(v, (dict, list)) else v
    return dg.AssetCheckResult(
        check_name=check.name,
        asset_key=asset_key,
        passed=outcome.passed,
        severity=dg.AssetCheckSeverity.ERROR if check.blocking else dg.AssetCheckSeverity.WARN,
        description=outcome.summary()[:2000],
        metadata=metadata,
    )


def to_check_results(asset_key: str | dg.AssetKey, checks: DatasetChecks,
                     outcomes: Iterable[CheckOutcome]) -> list[dg.AssetCheckResult]:
    return [to_check_result(asset_key, checks.get(o.check), o) for o in outcomes]


def read_partition(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """A written Parquet partition (a directory of part files, or one file) as pandas.

    Integer columns with nulls come back as pandas nullable ``Int64`` so ids/positions are not
    silently turned into floats.
    """
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet").to_table(columns=list(columns) if columns else None)
    df = table.to_pandas(integer_object_nulls=False)
    for name, typ in zip(table.column_names, table.schema.types):
        if str(typ) in ("int64", "int32") and df[name].dtype.kind == "f":
            df[name] = df[name].astype("Int64")
    return df


def partition_schema(path: str | os.PathLike) -> dict[str, str]:
    """Column -> Arrow type name of a written Parquet partition."""
    import pyarrow.dataset as ds

    schema = ds.dataset(str(path), format="parquet").schema
    return {f.name: str(f.type) for f in schema}


def existing_partitions(base: str | os.PathLike, days: Iterable[str]) -> list[tuple[str, Path]]:
    out = []
    for d in days:
        p = layout.day_dir(base, d)
        if p.is_dir() and any(p.glob("*.parquet")):
            out.append((d, p))
    return out
