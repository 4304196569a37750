"""Data quality: Great Expectations 1.x suites per dataset, turned into Dagster asset checks.

* :mod:`quality.framework` — the reusable part (check declarations, GX validation with an
  ephemeral context, outcome -> ``dagster.AssetCheckResult``).
* :mod:`quality.events` — the checks of the ``events`` dataset.
"""
