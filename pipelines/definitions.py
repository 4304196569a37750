"""The one Definitions object of the genrank code location (``dagster dev -w workspace.yaml``)."""

import dagster as dg

from assets import partitions
from contracts import settings

# The partition set is decided here, when the code location loads, and pinned in the environment so that
# the sensor's planning and every process this one starts see the same set (assets/partitions.py).
partitions.pin_start_date(settings.genrank_home())

from assets import events, monitoring, sequences, serving, training
from assets.raw_logs import raw_logs
from pipelines.jobs import daily_job, daily_schedule, teacher_job
from assets.resources import default_resources
from pipelines.sensors import landing_sensor

defs = dg.Definitions(
    assets=[raw_logs, *dg.load_assets_from_modules([events, sequences, serving, training, monitoring])],
    asset_checks=dg.load_asset_checks_from_modules([events, sequences, training]),
    jobs=[daily_job, teacher_job],
    schedules=[daily_schedule],
    sensors=[landing_sensor],
    resources={**default_resources(), "dbt": sequences.dbt_resource()},
)
