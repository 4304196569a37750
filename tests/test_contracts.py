"""A shared default has one definition; the copy that cannot import it (dbt's YAML) must agree with it."""

import yaml

from assets.sequences import SequenceBuildConfig
from models.config import BackboneConfig
from transforms.sequences import DBT_PROJECT_DIR


def test_dbt_project_vars_are_the_sequence_build_defaults():
    dbt_vars = yaml.safe_load((DBT_PROJECT_DIR / "dbt_project.yml").read_text())["vars"]
    defaults = SequenceBuildConfig().model_dump()
    assert {k: dbt_vars.get(k) for k in defaults} == defaults
    # the samples' bucket ids index the models' per-bucket heads
    assert defaults["n_position_buckets"] == BackboneConfig().n_buckets
