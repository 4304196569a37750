"""Faults a test injects into a copy of a data root, to see the pipeline's guards catch them."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from contracts import layout


def shuffle_training_labels(home: str | os.PathLike, day: str, seed: int = 0) -> None:
    """Permutes the labels of day D's targets in ``home``'s training_samples partition, in place: a student
    trained on it learns nothing, the broken candidate the promotion gates must refuse. Only ever on a copy of
    a home (tests.conftest.copy_home): the partition no longer says what the events say."""
    import numpy as np
    import pandas as pd

    partition = layout.partition(home, layout.TRAINING_SAMPLES, day)
    df = pd.read_parquet(partition)
    target = df["is_target"].to_numpy()
    df.loc[target, "label"] = np.random.default_rng(seed).permutation(df.loc[target, "label"].to_numpy())
    staging = Path(tempfile.mkdtemp(dir=partition.parent))
    df.to_parquet(staging / "part-0.parquet", index=False)
    shutil.rmtree(partition)
    staging.rename(partition)
