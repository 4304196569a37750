"""The genrank command: bad input gets an error naming the value, and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

from pipelines.cli import main


def test_simulate_prints_summary(tmp_path, capsys):
    assert main(["simulate", "--preset", "tiny", "--seed", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for word in ("users", "impressions", "clicks", "CTR", "behaviors", "defects", "oracle AUC"):
        assert word in out


def test_unknown_preset_exits_2_naming_it(tmp_path, capsys):
    assert main(["simulate", "--preset", "gigantic", "--out", str(tmp_path)]) == 2
    assert "'gigantic'" in capsys.readouterr().err


def test_import_from_missing_directory_names_it(tmp_path, capsys):
    missing = tmp_path / "no_such_dataset"
    assert main(["import", "movielens", "--src", str(missing), "--out", str(tmp_path)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_run_without_landing_says_what_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GENRANK_HOME", str(tmp_path))
    assert main(["run", "--home", str(tmp_path)]) == 2
    assert "genrank simulate" in capsys.readouterr().err


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "--help"], capture_output=True, text=True, check=True)
    assert "simulate" in out.stdout and "import" in out.stdout
