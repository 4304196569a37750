import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (ROOT, HERE):  # the suite runs with --import-mode=importlib: make models/ and mt_util importable
    if p not in sys.path:
        sys.path.insert(0, p)

# 2 shared cores: intra-op thread pools thrash under load (700 ms vs 14 ms per tiny step)
torch.set_num_threads(1)

from testkit.synthetic_samples import write_training_samples  # noqa: E402


@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_samples")
    write_training_samples(str(root), n_days=2, n_users=12, hist_len=(10, 40), seed=7, row_group_size=40)
    return str(root)


@pytest.fixture(scope="session")
def overfit_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("overfit_samples")
    write_training_samples(str(root), n_days=1, n_users=24, hist_len=(10, 30), seed=3)
    return str(root)
