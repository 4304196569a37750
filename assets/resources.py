"""Dagster resources: data paths, Spark, DuckDB and MLflow, configured once from contracts.settings."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from contracts import layout, settings


class GenrankPaths(dg.ConfigurableResource):
    """Where every dataset lives under the data root (GENRANK_HOME)."""

    home: str

    @property
    def root(self) -> Path:
        return Path(self.home)

    @property
    def landing(self) -> Path:
        return layout.landing(self.root)

    @property
    def lake(self) -> Path:
        return layout.lake(self.root)

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    def lake_partition(self, dataset: str, day: str) -> Path:
        return layout.partition(self.root, dataset, day)

    def lake_days(self, dataset: str) -> list[str]:
        """The days that have a partition of ``dataset`` in the lake, oldest first."""
        return layout.days_in(layout.dataset(self.root, dataset))


class SparkResource(dg.ConfigurableResource):
    """One SparkSession per run: created on first use, stopped when the run's step ends.

    ``master`` is ``local[*]`` by default; any cluster URL (``spark://``, ``yarn``, ``k8s://``) works
    as long as the lake paths are reachable from the executors.
    """

    master: str = "local[*]"
    driver_memory: str = settings.VARIABLES["GENRANK_SPARK_DRIVER_MEMORY"][0]
    shuffle_partitions: int = 4
    executor_wait_s: float = 300   # a cluster job with no executor this long is cancelled (transforms/spark/session.py)
    _session: object = PrivateAttr(default=None)

    def get_session(self):
        if self._session is None:
            from transforms.spark.session import build_session

            self._session = build_session(
                master=self.master,
                driver_memory=self.driver_memory,
                shuffle_partitions=self.shuffle_partitions,
                executor_wait_s=self.executor_wait_s,
            )
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


class MlflowResource(dg.ConfigurableResource):
    tracking_uri: str

    def configure(self) -> None:
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)


class OnlineStoreResource(dg.ConfigurableResource):
    """The online sequence store: ``url`` empty for the embedded LMDB store under GENRANK_HOME, else redis://."""

    url: str = ""

    def open(self, home: Path):
        from deploy.sequence_store import open_store

        return open_store(self.url, home, readonly=False)

    def describe(self, home: Path) -> str:
        return self.url or str(Path(home) / "online_store")


def default_resources() -> dict[str, dg.ConfigurableResource]:
    home = settings.genrank_home()
    return {
        "paths": GenrankPaths(home=str(home)),
        "spark": SparkResource(
            master=settings.env("GENRANK_SPARK_MASTER", "local[*]"),
            driver_memory=settings.spark_driver_memory(),
            executor_wait_s=float(settings.env("GENRANK_SPARK_EXECUTOR_WAIT_S",
                                               settings.VARIABLES["GENRANK_SPARK_EXECUTOR_WAIT_S"][0])),
        ),
        "mlflow": MlflowResource(
            tracking_uri=settings.tracking_uri(home),
        ),
        "online_store": OnlineStoreResource(url=settings.online_store()),
    }
