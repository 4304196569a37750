"""The one Definitions object of the genrank code location (``dagster dev -w workspace.yaml``)."""

import dagster as dg

from assets import events
from assets.raw_logs import raw_logs
from pipelines.jobs import daily_job
from pipelines.resources import default_resources
from pipelines.sensors import landing_sensor

defs = dg.Definitions(
    assets=[raw_logs, *dg.load_assets_from_modules([events])],
    asset_checks=dg.load_asset_checks_from_modules([events]),
    jobs=[daily_job],
    sensors=[landing_sensor],
    resources=default_resources(),
)
