"""The MLflow UI as a reviewer opens it: a real `mlflow server` on the tiny run's registry, the champion's
version page rendered by headless Chromium, showing its model card and its alias."""

from __future__ import annotations

import pytest

from deploy import registry as reg
from deploy.stack import BIN, free_port
from tests.operating.services import Service, browse
from tests.conftest import copy_home

pytestmark = pytest.mark.slow


def test_the_champions_registry_page_shows_its_card_and_aliases(tiny_pipeline, tmp_path):
    source, _, _ = tiny_pipeline
    home = copy_home(source, tmp_path / "home")      # other tests change the registry; the reviewer's view is of this copy
    champion = reg.default_registry(home).by_alias(reg.CTR, "champion")
    assert champion is not None and champion.description.startswith(f"### genrank-ctr v{champion.version}: approved")
    port = free_port()
    server = Service("mlflow-server", [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                                       "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                     {"MLFLOW_ENABLE_TELEMETRY": "false", **_env()}, tmp_path)
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=240)
        shot = tmp_path / "champion-version.png"
        page = browse(f"http://127.0.0.1:{port}/#/models/{reg.CTR}/versions/{champion.version}", shot, budget_ms=25000)
        text = " ".join(page.replace("<", " <").split())
        assert f"genrank-ctr v{champion.version}: approved" in text
        assert "every gate passed" in text and "against" in text and "calibration_by_bucket.png" in text
        assert "champion" in text
        print(f"screenshot: {shot}")
    finally:
        server.stop()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
