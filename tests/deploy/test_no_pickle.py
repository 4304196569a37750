"""No pickle on the model path: a malicious pickle planted where a checkpoint belongs is refused by
every loader without running it (the final weights and the resumable training checkpoint)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from models import preset
from models.student import Student
from models.train import fit, load_model, save_model


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):  # unpickling this runs a shell command that creates the marker file
        return os.system, (f"touch {self.marker}",)


def _plant(path, marker):
    with open(path, "wb") as f:
        pickle.dump({"kind": "student", "state_dict": _Payload(marker)}, f)


def _student():
    _, cfg, _ = preset("tiny")
    return Student(cfg)


def test_a_planted_pickle_is_refused_as_a_checkpoint_without_running(tmp_path):
    marker = tmp_path / "pwned"
    for name in ("student.safetensors", "student.pt"):
        _plant(tmp_path / name, marker)
        with pytest.raises(ValueError, match="not a safetensors checkpoint"):
            load_model(str(tmp_path / name))
    assert not marker.exists()
    model = _student()
    back = load_model(save_model(model, str(tmp_path / "real.safetensors"), metadata={"day": "2026-01-01"}))
    assert back.metadata == {"day": "2026-01-01"}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_a_planted_pickle_is_refused_as_a_resume_checkpoint_without_running(tmp_path):
    marker = tmp_path / "pwned"
    _plant(tmp_path / "latest.pt", marker)
    with pytest.raises(pickle.UnpicklingError):
        fit(_student(), [], ckpt_dir=str(tmp_path), resume=True)
    assert not marker.exists()
