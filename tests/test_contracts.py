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


def test_every_writer_and_reader_of_a_day_builds_the_one_layout(tmp_path):
    """contracts.layout is the lake's and the landing zone's path layout: the resource the assets use, the landing
    contract, the sequence build's export and the online store's reader all land on its folders."""
    from assets.resources import GenrankPaths
    from contracts import layout
    from deploy.sequence_store import partition_files
    from transforms import landing

    day = "2026-01-03"
    assert layout.partition(tmp_path, layout.EVENTS, day) == tmp_path / "lake" / "events" / f"date={day}"
    assert GenrankPaths(home=str(tmp_path)).lake_partition(layout.TRAINING_SAMPLES, day) == \
        tmp_path / "lake" / "training_samples" / f"date={day}"
    assert landing.day_dir(tmp_path, day) == tmp_path / "landing" / f"date={day}"

    sequences = layout.dataset(tmp_path, layout.USER_SEQUENCES)
    for d in ("2026-01-04", day):
        layout.day_dir(sequences, d).mkdir(parents=True)
        (layout.day_dir(sequences, d) / "part-0.parquet").touch()
    (sequences / ".tmp-date=2026-01-05-1a2b").mkdir()   # a writer's staging folder is not a day
    assert layout.days_in(sequences) == [day, "2026-01-04"]
    assert GenrankPaths(home=str(tmp_path)).lake_days(layout.USER_SEQUENCES) == [day, "2026-01-04"]
    assert partition_files(layout.lake(tmp_path), [day]) == [str(sequences / f"date={day}" / "part-0.parquet")]
    assert layout.days_in(tmp_path / "nothing-here") == []
