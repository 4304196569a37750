"""Dagster asset definitions, one module per stage. Thin glue over transforms/, models/, quality/, deploy/."""

import warnings

from dagster import BetaWarning

# Two beta parameters the project relies on on purpose: raw_logs' D-1..D+1 mapping must allow the days
# before the first partition and after the last, and the dbt stage builds a range in one run.
warnings.filterwarnings("ignore", category=BetaWarning,
                        message=r"Parameter `(allow_nonexistent_upstream_partitions|backfill_policy)` of ")
