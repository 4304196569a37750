"""The worlds the model-quality report runs on: simulated ones (WORLDS) and imported public datasets, each
built into its own GENRANK_HOME through the pipeline's stages (samples.py) and split into training days and
out-of-time test days."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

from benchmarks.quality_suite.samples import build_training_samples, sample_days


@dataclasses.dataclass
class World:
    name: str
    home: Path
    days: list[str]            # training_samples days, in order
    train_days: list[str]
    eval_days: list[str]       # the out-of-time test
    simulated: bool
    note: str = ""

    def samples(self, days) -> list[str]:
        return [str(self.home / "lake" / "training_samples" / f"date={d}") for d in days]


def _split(name: str, home: Path, days: list[str], eval_days: int, simulated: bool) -> World:
    if len(days) < eval_days + 2:
        raise ValueError(f"{home}: {len(days)} day(s) of training samples; need at least {eval_days + 2}")
    n_train = len(days) - eval_days
    return World(name, home, days, days[:n_train], days[n_train:], simulated=simulated)


# The worlds the report runs on (issue #18): the demo world and two others with other seeds, sizes and
# effect strengths (`genrank simulate` options, transforms/simulator/world.py Strengths), chosen before any
# model ran on them and never used to choose a training setting. "history-heavy": stronger session and
# long-range memory, so the user sequence carries more of the signal; "item-heavy": weaker history effects,
# stronger ad quality and a higher base rate (intercept -2.0: CTR 13.9 % against the demo's 6.9 %). Both are
# smaller than the demo world (fewer days: every day costs a pipeline partition on a 2-core machine).
WORLDS: dict[str, dict] = {
    "demo": {"preset": "demo", "seed": 0},
    "history-heavy": {"preset": "demo", "seed": 1, "strengths": "session=1.5,long_range=2,long_term=0.6",
                      "users": 250, "days": 6},
    "item-heavy": {"preset": "demo", "seed": 2, "strengths": "session=0.5,long_range=0.6,quality=0.9",
                   "users": 250, "days": 5, "bias_logit": -2.0},
}
# Issue #33's worlds, where order and identity matter: the `sequence` preset (the demo's sizes with the complement
# and abandonment effects, world.py) and two others, chosen before any model ran on them: "complement-heavy"
# leans on the cross-category transitions, "order-heavy" on the order of a brand's carts and buys. Not in the
# default --worlds: each costs as much as a world above (`--worlds sequence,complement-heavy,order-heavy`).
SEQUENCE_WORLDS: dict[str, dict] = {
    "sequence": {"preset": "sequence", "seed": 0},
    "complement-heavy": {"preset": "sequence", "seed": 1, "strengths": "complement=1.5,abandonment=1",
                         "users": 250, "days": 6},
    "order-heavy": {"preset": "sequence", "seed": 2, "strengths": "complement=0.6,abandonment=3",
                    "users": 250, "days": 6},
    # the `sequence` world with five times its users (the same seed, effects and days): whether data is what keeps
    # the models from the two effects (RESULTS, "Five times the users"); run it with --no-step-cap
    "sequence-5x": {"preset": "sequence", "seed": 0, "users": 1500},
}


def world_spec_text(spec: dict) -> str:
    opts = [f"--preset {spec['preset']}", f"--seed {spec['seed']}"]
    opts += [f"--{k.replace('_', '-')} {spec[k]}" for k in ("strengths", "users", "days", "bias_logit") if k in spec]
    return "genrank simulate " + " ".join(opts)


def prepare_simulated(home: Path, name: str, spec: dict, n_days: int | None, eval_days: int) -> World:
    from pipelines.cli import world_config
    from transforms import landing
    from transforms.simulator import simulate

    home.mkdir(parents=True, exist_ok=True)
    if not landing.complete_days(home):
        print(f"  {world_spec_text(spec)} into {home}", flush=True)
        config = world_config(spec["preset"], spec.get("strengths"), spec.get("users"), spec.get("days"),
                              spec.get("bias_logit"))
        with contextlib.redirect_stdout(sys.stderr):
            simulate(preset=spec["preset"], seed=spec["seed"], out=home, config=config)
    build_training_samples(home)
    days = sample_days(home)
    if n_days:
        days = days[:n_days]
    return _split(f"world `{name}` ({world_spec_text(spec)})", home, days, eval_days, True)


def prepare_imported(dataset: str, name: str, home: Path, src: Path, eval_days: int, **options) -> World:
    """A public dataset through its importer (`genrank import <dataset>`) and the pipeline's stages."""
    from transforms import landing
    from transforms.importers import import_dataset

    home.mkdir(parents=True, exist_ok=True)
    if not landing.complete_days(home):
        print(f"  importing {name} into {home}", flush=True)
        report = import_dataset(dataset, src, home, **options)
        if not report.reconciled:
            raise RuntimeError(f"{dataset} import did not reconcile:\n{report.summary()}")
    build_training_samples(home)
    return _split(name, home, sample_days(home), eval_days, False)
