"""The online sequence store the scoring service reads (deploy/sequence_store.py), fed by user_sequences."""

import dagster as dg

from deploy.sequence_store import update_day
from models.config import DEMO_SIZES, FeatureConfig
from assets.partitions import daily_partitions
from assets.resources import GenrankPaths, OnlineStoreResource


class OnlineStoreConfig(dg.Config):
    max_events: int = DEMO_SIZES.counter_events  # the served student's counter_len: its counters count them all
    hash_key: str = FeatureConfig().hash_key     # the ids' hash key (the served student's FeatureConfig)


@dg.asset(group_name="serving", partitions_def=daily_partitions(),
          deps=[dg.AssetKey("user_sequences"), dg.AssetKey("item_windows")],
          backfill_policy=dg.BackfillPolicy.single_run(),
          description="Each user's newest max_events events as of D in the online store (embedded LMDB under "
                      "GENRANK_HOME/online_store, or Redis with GENRANK_ONLINE_STORE): only the users active on D "
                      "are rewritten when the store is at D-1 (else it is rebuilt from the lake), and the day is "
                      "published atomically, with the item statistics (per ad and campaign) for the requests "
                      "after it.")
def online_sequences(context: dg.AssetExecutionContext, paths: GenrankPaths, online_store: OnlineStoreResource,
                     config: OnlineStoreConfig) -> dg.MaterializeResult:
    store = online_store.open(paths.root)
    try:
        reports = [update_day(store, paths.lake, day, config.max_events, config.hash_key)
                   for day in context.partition_keys]  # in date order: each day merges into the one before
    finally:
        store.close()
    last = reports[-1]
    for r in reports:
        context.log.info(f"{r.day}: {r.mode}, {r.users_written} users written ({r.new_users} new), "
                         f"{r.events_read} events read, {r.item_records} item records in {r.seconds:.2f} s")
    return dg.MaterializeResult(metadata={
        "as_of": last.day, "mode": last.mode, "users_written": last.users_written, "new_users": last.new_users,
        "events_read": last.events_read, "users": last.users, "seconds": last.seconds,
        "item_records": last.item_records,
        "store": online_store.describe(paths.root), "max_events": config.max_events,
        "per_day": dg.MetadataValue.json([r.__dict__ for r in reports]),
    })
