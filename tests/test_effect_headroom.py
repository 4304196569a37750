"""benchmarks/effect_headroom.py rebuilds the simulator's own terms of the click logit: the same impressions the
world's oracle table holds, and a term only for the effects the world turns on."""
import numpy as np
import pandas as pd

from benchmarks.effect_headroom import effect_terms
from pipelines.cli import world_config
from transforms.simulator import simulate


def test_effect_terms_are_the_worlds_own_impressions(tmp_path):
    spec = {"preset": "tiny", "seed": 3, "strengths": "complement=1.5,abandonment=2", "users": 12, "days": 3}
    simulate(preset="tiny", seed=3, out=tmp_path,
             config=world_config(spec["preset"], spec["strengths"], spec["users"], spec["days"], None))
    oracle = pd.concat(pd.read_parquet(p) for p in sorted((tmp_path / "simulator" / "oracle").glob("date=*/*.parquet")))
    terms = effect_terms(spec)
    assert list(terms.columns) == ["impression_id", "complement", "abandonment"]
    assert sorted(terms["impression_id"]) == sorted(oracle["impression_id"])
    assert (terms["complement"] > 0).any() and (terms["abandonment"] != 0).any()
    assert np.all(terms["complement"] >= 0)  # a weighted log1p of decayed counts
    only = effect_terms({**spec, "strengths": "complement=1.5"})
    assert list(only.columns) == ["impression_id", "complement"]
