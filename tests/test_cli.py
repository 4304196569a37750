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


def test_simulate_takes_effect_strengths_sizes_and_the_base_rate(tmp_path, capsys):
    import json

    args = ["simulate", "--preset", "tiny", "--strengths", "session=0, long_range=2.5", "--users", "6", "--days", "2",
            "--bias-logit", "-1.5", "--out", str(tmp_path)]
    assert main(args) == 0
    manifest = json.loads((tmp_path / "simulator" / "manifest.json").read_text())
    cfg = manifest["config"]
    assert cfg["n_users"] == 6 and cfg["bias_logit"] == -1.5 and len(manifest["days"]) == 2
    assert cfg["strengths"]["session"] == 0.0 and cfg["strengths"]["long_range"] == 2.5
    assert cfg["strengths"]["long_term"] == 0.45  # untouched effects keep the preset's strength
    assert "CTR" in capsys.readouterr().out


def test_simulate_refuses_an_unknown_effect_or_a_bad_value(tmp_path, capsys):
    assert main(["simulate", "--preset", "tiny", "--strengths", "sesion=1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'sesion=1'" in err and "session" in err
    assert main(["simulate", "--preset", "tiny", "--strengths", "session=high", "--out", str(tmp_path)]) == 2
    assert "session='high'" in capsys.readouterr().err
    assert main(["simulate", "--preset", "tiny", "--users", "0", "--out", str(tmp_path)]) == 2
    # a value out of its effect's range is named, and nothing is written
    assert main(["simulate", "--preset", "tiny", "--strengths", "complement=-1", "--out", str(tmp_path)]) == 2
    assert "complement=-1.0" in capsys.readouterr().err
    assert main(["simulate", "--preset", "tiny", "--strengths", "abandonment_half_life_hours=0", "--out",
                 str(tmp_path)]) == 2
    assert "abandonment_half_life_hours=0.0: a decay or half-life must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "landing").exists()


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
