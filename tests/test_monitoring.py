"""serving_monitor (deploy/monitoring.py): a shifted tiny world drifts on its shift day and on no other, a day
without a prediction log is "not served" without loading a model, cut or malformed log lines are
quarantined with a reason, and a day scored by the real service shows no skew (a tampered score does)."""

from __future__ import annotations

import dataclasses
import os
import shutil

import dagster as dg
import orjson
import pandas as pd
import pytest

import deploy.monitoring as monitoring
from contracts import layout
from deploy.monitoring import ERROR, PASS, QUARANTINE, input_drift, landing_impressions, monitor_day, read_log
from transforms import landing
from transforms.simulator import SimulationError, resolve_config, simulate

TINY = resolve_config("tiny")


@pytest.fixture(scope="module")
def shifted_world(tmp_path_factory):
    """The tiny world (seed 0) with its third day as the shift day: (root, report, shift day)."""
    root = tmp_path_factory.mktemp("shifted")
    shift = "2026-01-03"
    report = simulate(preset="tiny", seed=0, out=root, config=dataclasses.replace(TINY, shift_day=shift))
    return root, report, shift


def _no_registry():
    raise AssertionError("a day without a prediction log must not open the registry")


def test_the_shift_changes_the_world_from_its_day_only(shifted_world, tiny_world):
    root, report, shift = shifted_world
    unshifted = tiny_world[0]
    for day in report.days:
        ads = landing_impressions(root, day)["ad_id"].astype(int)
        if day < shift:  # the days before the shift are the unshifted world's, byte for byte
            for path in sorted(landing.day_dir(root, day).iterdir()):
                assert path.read_bytes() == (landing.day_dir(unshifted, day) / path.name).read_bytes(), path
            assert (ads < TINY.n_ads).all()
        else:            # every ad shown comes from the new pool
            assert (ads >= TINY.n_ads).all() and len(ads) > 100


def test_a_landing_day_is_parsed_once_per_version_of_its_files(tiny_world, tmp_path, monkeypatch):
    root, day = tmp_path / "world", "2026-01-02"
    shutil.copytree(tiny_world[0], root)
    first = landing_impressions(root, day)
    parsed = []
    parse = monitoring._parse_landing_impressions
    monkeypatch.setattr(monitoring, "_parse_landing_impressions", lambda *a: parsed.append(a) or parse(*a))
    pd.testing.assert_frame_equal(landing_impressions(root, day), first)
    assert parsed == []
    landed = next(p for p in sorted(landing.day_dir(root, day).iterdir()) if p.name.startswith("impressions"))
    os.utime(landed, ns=(landed.stat().st_atime_ns, landed.stat().st_mtime_ns + 1))   # the file landed again
    pd.testing.assert_frame_equal(landing_impressions(root, day), first)
    assert len(parsed) == 1
    assert len(list(layout.partition(root, monitoring.LANDING_FEATURES, day).iterdir())) == 1


@pytest.mark.parametrize("shift_day", ["2026-01-01", "2026-02-01", "January"])
def test_a_shift_day_outside_the_world_after_its_first_day_is_refused(shift_day, tmp_path):
    with pytest.raises(SimulationError, match="--shift-day"):
        simulate(preset="tiny", out=tmp_path, config=dataclasses.replace(TINY, shift_day=shift_day))


def test_simulate_takes_a_shift_day_and_names_a_bad_one(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["simulate", "--preset", "tiny", "--days", "2", "--shift-day", "2026-01-02",
                 "--out", str(tmp_path / "ok")]) == 0
    assert (landing_impressions(tmp_path / "ok", "2026-01-02")["ad_id"].astype(int) >= TINY.n_ads).all()
    assert main(["simulate", "--preset", "tiny", "--shift-day", "2026-01-09", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "--shift-day 2026-01-09: choose a simulated day after the first (2026-01-02..2026-01-04)" in err
    assert not (tmp_path / "bad" / "landing").exists()


def test_drift_fires_on_the_shift_day_and_on_no_other(shifted_world, tiny_world):
    root, report, shift = shifted_world
    for world in (root, tiny_world[0]):
        for before, day in zip(report.days, report.days[1:]):
            drift = {f.feature: f for f in input_drift(world, day, [before], set(report.days))}
            severities = {f.severity for f in drift.values()}
            if world == root and day == shift:
                assert drift["category_id"].severity == drift["new_ads"].severity == ERROR, drift
            else:
                assert severities == {PASS}, (world, day, drift)


@pytest.mark.breaks("serving_monitor:drift")
def test_a_day_without_a_log_is_not_served_and_its_run_succeeds(shifted_world, monkeypatch):
    """The asset on the shift day of a world nobody served: no model is loaded, skew and calibration pass as
    skipped, the landing's drift is an ERROR-severity check that does not fail the run."""
    from assets.monitoring import serving_monitor
    from assets.resources import GenrankPaths, MlflowResource

    root, _, shift = shifted_world
    monkeypatch.setenv("GENRANK_SERVE_PREDICTION_LOG", str(root / "prediction_log"))
    report = monitor_day(root, shift, set(landing.complete_days(root)), root / "prediction_log", _no_registry)
    assert not report.served and report.skew.compared_requests == 0 and report.calibration.empty
    result = dg.materialize([serving_monitor], partition_key=shift, resources={
        "paths": GenrankPaths(home=str(root)), "mlflow": MlflowResource(tracking_uri=f"sqlite:///{root}/absent.db")})
    assert result.success
    [mat] = result.asset_materializations_for_node("serving_monitor")
    assert mat.metadata["served"].value is False and mat.metadata["logged_requests"].value == 0
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["skew"].passed and checks["live_calibration"].passed
    assert not checks["drift"].passed and checks["drift"].severity == dg.AssetCheckSeverity.ERROR
    assert not (root / "mlflow.db").exists() and not (root / "absent.db").exists()


def _record(day_ms: int, **changes) -> dict:
    return {"request_id": "r1", "ts_ms": day_ms + 1000, "user_id": "u1", "history_source": "store",
            "history_events": 3, "candidates": {"ad_id": ["a", "b"], "surface": ["feed", "feed"]},
            "model_version": "1", "scores": [[0.1, 0.2], [0.3, 0.4]], "store_as_of": "2026-01-01",
            "latency_ms": 1.5, "worker_pid": 7, **changes}


def test_cut_and_malformed_log_lines_are_quarantined_with_a_reason_and_counted(tmp_path):
    day = "2026-01-02"
    start = landing.day_start_ms(day)
    good = orjson.dumps(_record(start))
    lines = [good, good[:40], b"[1, 2]", orjson.dumps({k: v for k, v in _record(start).items() if k != "scores"}),
             orjson.dumps(_record(start, ts_ms="soon")), orjson.dumps(_record(start, scores=[[0.1, 0.2]])),
             orjson.dumps(_record(start, scores=[[0.1, 2.0], [0.3, 0.4]])),
             orjson.dumps(_record(start, ts_ms=start - 1)), b"", good]
    folder = tmp_path / "log" / f"date={day}"
    folder.mkdir(parents=True)
    (folder / "predictions-1-abc-00001.jsonl").write_bytes(b"\n".join(lines))  # the last line is not terminated
    got = read_log(tmp_path / "log", day, tmp_path / QUARANTINE)
    assert len(got.records) == 2 and got.lines == 9
    assert got.quarantined == {"malformed_json": 2, "missing_key": 1, "bad_type": 1, "bad_scores": 2, "wrong_day": 1}
    quarantined = [orjson.loads(x) for x in (tmp_path / QUARANTINE / f"date={day}" / "quarantined.jsonl").read_bytes()
                   .splitlines()]
    assert [q["line"] for q in quarantined] == [2, 3, 4, 5, 6, 7, 8]
    assert quarantined[0] == {"file": "predictions-1-abc-00001.jsonl", "line": 2, "reason": "malformed_json",
                              "text": good[:40].decode()}


@pytest.mark.slow
@pytest.mark.breaks("serving_monitor:skew")
def test_a_day_replayed_through_the_service_has_no_skew_and_a_tampered_score_is_an_error(tiny_pipeline, tmp_path):
    """`genrank serve --workers 2` with the tiny run's champion answers the last day's first 40 requests sent by
    `replay` over HTTP; the monitor re-scores them offline from the registry and the lake: no skew, and every
    served candidate joins a labelled impression for the calibration. One served probability moved by 0.01 in
    the log is a skew ERROR."""
    from deploy.registry import Registry
    from deploy.replay import day_requests, replay
    from tests.deploy.test_service import _serving

    src = tiny_pipeline[0]
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy2(src / "mlflow.db", home / "mlflow.db")   # artifacts stay where the run logged them
    shutil.copytree(src / "online_store", home / "online_store")
    for dataset in ("user_sequences", "training_samples", "item_windows"):
        shutil.copytree(src / "lake" / dataset, home / "lake" / dataset)
    shutil.copytree(src / "landing", home / "landing")
    day = landing.complete_days(src)[-1]
    plog = home / "prediction_log"
    with _serving(home, GENRANK_SERVE_PREDICTION_LOG=str(plog)) as (_, url):
        sent = replay(src, day, url, max_requests=40)
    # the service has stopped: its workers drained their logs on the way out
    scored = sent.count(200, 300)
    assert sent.sent == 40 and scored >= 30, sent.summary()
    ok_bodies = day_requests(src, day).bodies[:40]

    landed = set(landing.complete_days(home))
    registry = lambda: Registry(f"sqlite:///{home / 'mlflow.db'}", src / "mlartifacts")  # noqa: E731
    report = monitor_day(home, day, landed, plog, registry)
    assert report.served and report.skew.compared_requests == scored and report.skew.severity == PASS
    assert report.skew.max_abs_diff <= report.skew.tolerance
    logged = {r["request_id"]: len(r["candidates"]["ad_id"]) for r in report.log.records}
    assert len(logged) == scored and set(logged) <= {orjson.loads(b)["request_id"] for b in ok_bodies}
    assert report.calibration["n"].sum() == sum(logged.values())

    path = sorted((plog / f"date={day}").glob("*.jsonl"))[0]
    lines = path.read_bytes().splitlines()
    first = orjson.loads(lines[0])
    first["scores"][0][0] += 0.01 if first["scores"][0][0] < 0.99 else -0.01
    path.write_bytes(b"\n".join([orjson.dumps(first), *lines[1:]]) + b"\n")
    tampered = monitor_day(home, day, landed, plog, registry)
    assert tampered.skew.severity == ERROR and tampered.skew.max_abs_diff >= 0.0099


@pytest.mark.breaks("serving_monitor:live_calibration")
def test_served_probabilities_three_times_the_observed_ctr_are_a_calibration_warning(tmp_path):
    """80 users, 20 impressions each in one bucket, 10 % clicked: served at the observed CTR the bucket passes;
    served at three times it, it is a WARN (outside the gate's band widened by two clustered SEs)."""
    import numpy as np
    import pandas as pd

    from deploy.monitoring import WARN, live_calibration, served_candidates

    rng = np.random.default_rng(0)
    n_users, per_user = 80, 20
    labels = rng.permutation(np.r_[np.ones(n_users * per_user // 10), np.zeros(n_users * per_user * 9 // 10)])
    rows = [{"request_id": f"r{u}-{i}", "item_id": f"ad{i}", "position": 1, "position_bucket": 0,
             "label": labels[u * per_user + i], "is_target": True, "event_kind": "impression", "user_id": f"u{u}"}
            for u in range(n_users) for i in range(per_user)]
    samples = tmp_path / "date=2026-01-04"
    samples.mkdir()
    pd.DataFrame(rows).to_parquet(samples / "part-0.parquet", index=False)

    def served(p: float) -> pd.DataFrame:
        return served_candidates([{"request_id": r["request_id"], "user_id": r["user_id"], "ts_ms": 0,
                                   "model_version": "1", "history_events": 0,
                                   "candidates": {"ad_id": [r["item_id"]]}, "scores": [[p, p]]} for r in rows])

    calibrated = live_calibration(served(0.1), samples)
    assert list(calibrated["severity"]) == [PASS] and calibrated["clicks"].sum() == 160
    inflated = live_calibration(served(0.3), samples)
    assert list(inflated["severity"]) == [WARN] and abs(float(inflated["calibration"].iloc[0]) - 3.0) < 1e-9
