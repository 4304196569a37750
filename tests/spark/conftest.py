"""Spark fixtures: one local[2] SparkSession for the whole test session, stopped at the end."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def spark():
    from transforms.spark.session import build_session

    session = build_session(master="local[2]", driver_memory="1g", shuffle_partitions=2, app_name="genrank-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def shared_spark_resource(spark):
    """A SparkResource that hands out the test session and does not stop it after each run."""
    from assets.resources import SparkResource

    class SharedSparkResource(SparkResource):
        def teardown_after_execution(self, context) -> None:  # the session fixture stops it
            self._session = None

    return SharedSparkResource(master=spark.sparkContext.master, driver_memory="1g", shuffle_partitions=2)
