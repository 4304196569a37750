"""Jobs: the daily run materialises every daily asset for one partition."""

import dagster as dg

from pipelines.partitions import daily_partitions

daily_job = dg.define_asset_job(
    "daily_job",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("raw_logs"),
    partitions_def=daily_partitions,
    description="Everything downstream of the landing zone for one day.",
)
