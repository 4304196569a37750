"""Shared fixtures: one simulated tiny world per test session (read-only for the tests that use it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "true")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The `tiny` preset, seed 0, simulated once: (root, SimulationReport)."""
    from transforms.simulator import simulate

    root = tmp_path_factory.mktemp("tiny_world")
    report = simulate(preset="tiny", seed=0, out=root)
    print("\n" + report.summary())
    return root, report
