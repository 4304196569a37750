"""A registration is all or nothing (deploy/registry.py): a version whose registration broke off (the tracking
server went away after creating it) is never found, so no step reuses or promotes it, and the next
registration of the same model deletes it.

What is checked is the registry's protocol on the SQLite store, with its faults injected by monkeypatches:
the client's ``get_model_version`` raises the error an unreachable server gives, right after the version is
created, and ``mlflow.pyfunc.log_model`` is replaced by a run artifact. No test here talks to a tracking
server: benchmarks/stack_faults.py breaks registrations against the stack's real server, as a benchmark."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from deploy import registry as reg

TAGS = {"partition": "2026-01-02", "data_fingerprint": "abc", "code_version": "123"}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    import mlflow.pyfunc

    registry = reg.Registry(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlartifacts")
    registry.ensure_registered(reg.CTR, "test")
    monkeypatch.setattr(mlflow.pyfunc, "log_model",
                        lambda **_: SimpleNamespace(model_uri=f"runs:/{mlflow.active_run().info.run_id}/model", model_id=None))
    return registry


def _register(registry: reg.Registry, tags: dict[str, str] = TAGS) -> str:
    run = registry.client.create_run(registry.experiment_id(reg.CTR))
    example = pd.DataFrame({"x": [1.0]})
    return registry.log_version(reg.CTR, run.info.run_id, "unused.safetensors", example, example, tags=tags,
                                description="a card")


def _server_gone_after_create(registry: reg.Registry, monkeypatch) -> None:
    def unreachable(*args, **kwargs):
        raise MlflowException("API request to http://127.0.0.1:15000 failed: Connection refused")

    monkeypatch.setattr(registry.client, "get_model_version", unreachable)


def test_a_broken_off_registration_is_never_found_and_the_next_one_deletes_it(registry, monkeypatch):
    with monkeypatch.context() as fault:
        _server_gone_after_create(registry, fault)
        with pytest.raises(MlflowException, match="Connection refused"):
            _register(registry)
    [broken] = registry.client.search_model_versions(f"name = '{reg.CTR}'")
    assert broken.tags[reg.REGISTRATION_TAG] == reg.IN_PROGRESS and broken.tags["partition"] == TAGS["partition"]
    assert registry.find(reg.CTR, partition=TAGS["partition"]) is None
    assert registry.find(reg.CTR) is None

    version = _register(registry)
    [mv] = registry.client.search_model_versions(f"name = '{reg.CTR}'")
    assert mv.version == version != broken.version and mv.tags[reg.REGISTRATION_TAG] == reg.COMPLETE
    assert registry.find(reg.CTR, partition=TAGS["partition"]).version == version


def test_only_the_same_models_broken_off_registrations_are_deleted(registry, monkeypatch):
    other_day = {**TAGS, "partition": "2026-01-03"}
    with monkeypatch.context() as fault:
        _server_gone_after_create(registry, fault)
        with pytest.raises(MlflowException):
            _register(registry, other_day)
    _register(registry)
    kept = {v.tags["partition"]: v.tags[reg.REGISTRATION_TAG] for v in registry.client.search_model_versions(f"name = '{reg.CTR}'")}
    assert kept == {"2026-01-02": reg.COMPLETE, "2026-01-03": reg.IN_PROGRESS}
    assert registry.find(reg.CTR, partition="2026-01-03") is None


def test_a_version_registered_before_the_registration_tag_counts_as_complete(registry):
    run = registry.client.create_run(registry.experiment_id(reg.CTR))
    mv = registry.client.create_model_version(reg.CTR, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id, tags=TAGS)
    assert registry.find(reg.CTR, **TAGS).version == mv.version


def test_a_candidate_warm_starts_only_from_a_complete_version(registry, monkeypatch):
    from assets.training import _newest_candidate_before

    done = _register(registry)
    with monkeypatch.context() as fault:
        _server_gone_after_create(registry, fault)
        with pytest.raises(MlflowException):
            _register(registry, {**TAGS, "partition": "2026-01-03"})
    assert str(_newest_candidate_before(registry, "2026-01-04").version) == str(done)
