"""The Spark events job on hand-made landing corpora: accounting, quarantine reasons, attribution,
atomic and idempotent writes, landing validation."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import contracts
from tests.spark.spark_corpus import behavior, click, impression, make_world
from tests.spark.spark_helpers import expected_vs_actual
from transforms import landing
from transforms.landing import dumps
from transforms.spark.events import EVENT_COLUMNS, QUARANTINE_COLUMNS, run_events_job, write_partition

pytestmark = pytest.mark.spark


def read_dir(path) -> pd.DataFrame:
    return pq.read_table(str(path)).to_pandas()


@pytest.fixture(scope="module")
def handmade(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("handmade")
    world = make_world(root, n_days=3)
    results = {d: run_events_job(spark, root, d) for d in world.days}
    return world, results


def test_accounting_matches_manifest_exactly(handmade):
    world, results = handmade
    mismatches = {}
    for day, r in results.items():
        assert r.accounting_closes, r.summary()
        mismatches.update(expected_vs_actual(world.manifest, day, {k: vars(a) for k, a in r.accounting.items()}))
    assert mismatches == {}


def test_labels_click_type_and_dwell_follow_the_truth(handmade):
    world, results = handmade
    seen = 0
    for day, r in results.items():
        df = read_dir(r.events_path)
        imps = df[df.event_kind == "impression"].set_index("impression_id")
        expected = {k: v for k, v in world.truth.items() if k.startswith(f"i-{day}-")}
        assert set(imps.index) == set(expected)
        for iid, (label, ctype, dwell) in expected.items():
            row = imps.loc[iid]
            assert row.label == label, iid
            assert (row.click_type if label else None) == ctype
            got_dwell = None if pd.isna(row.dwell_ms) else int(row.dwell_ms)
            assert got_dwell == dwell, iid
            assert pd.isna(row.click_ts_ms) == (label == 0)
            seen += 1
    assert seen > 100


def test_event_table_schema_order_and_quarantine(handmade):
    world, results = handmade
    r = results[world.days[1]]
    table = pq.read_table(r.events_path)
    assert table.column_names == list(EVENT_COLUMNS)
    assert str(table.schema.field("ts_ms").type) == "int64" and str(table.schema.field("label").type) == "int32"
    assert sorted(p.name for p in Path(r.events_path).iterdir()) == ["part-00000.parquet"]
    ts = table.column("ts_ms").to_pylist()
    assert ts == sorted(ts), "events are time-ordered"
    q = read_dir(r.quarantine_path)
    assert list(q.columns) == list(QUARANTINE_COLUMNS)
    assert len(q) == r.quarantined
    # raw lines are kept verbatim: each quarantined raw line is in its source file at line_no
    for row in q.itertuples():
        lines = landing.read_lines(Path(world.root) / "landing" / row.source_file)
        assert lines[row.line_no - 1] == row.raw


def test_midnight_click_in_next_days_file_labels_the_impression(spark, tmp_path):
    d1, d2 = "2026-02-10", "2026-02-11"
    start2 = landing.day_start_ms(d2)
    imp = impression(d1, 1, start2 - 60_000, user=3)            # 23:59:00
    other = impression(d1, 2, start2 - 3_600_000, user=4)        # 23:00, never clicked
    late = click(imp, start2 + 10 * 60_000, "add_to_cart", 4321)  # 00:10 next day
    landing.write_day(tmp_path, d1, {"impressions": [dumps(imp), dumps(other)], "clicks": [], "behaviors": []})
    landing.write_day(tmp_path, d2, {"impressions": [], "clicks": [dumps(late)], "behaviors": []})

    r1 = run_events_job(spark, tmp_path, d1)
    assert r1.next_day_included
    df = read_dir(r1.events_path).set_index("impression_id")
    row = df.loc[imp["impression_id"]]
    assert (row.label, row.click_type, int(row.dwell_ms), int(row.click_ts_ms)) == (1, "add_to_cart", 4321, late["ts_ms"])
    assert df.loc[other["impression_id"]].label == 0
    assert r1.clicked_impressions == 1 and r1.ctr == 0.5

    # the click line belongs to D+1's accounting, as a late click of the previous day
    r2 = run_events_job(spark, tmp_path, d2)
    assert r2.accounting["clicks"].accepted_by_reason == {"attributed_previous_day": 1}
    assert r2.events_rows == 0 and r2.accounting_closes

    # without D+1 the same impression is unlabelled (the asset's grace period decides this case)
    r0 = run_events_job(spark, tmp_path, d1, use_next_day=False)
    assert not r0.next_day_included
    assert read_dir(r0.events_path).set_index("impression_id").loc[imp["impression_id"]].label == 0


def _bad_corpus(day: str):
    """One line per defect kind, with the reason each must get."""
    s = landing.day_start_ms(day)
    a, b, c = impression(day, 1, s + 1000, 1), impression(day, 2, s + 5000, 2), impression(day, 3, s + 9000, 3)
    expected = []  # (kind, raw line, outcome, reason)

    def add(kind, rec_or_line, outcome, reason):
        line = rec_or_line if isinstance(rec_or_line, str) else dumps(rec_or_line)
        expected.append((kind, line, outcome, reason))

    add("impressions", a, "accepted", "event")
    add("impressions", b, "accepted", "event")
    add("impressions", dict(c, debug="x"), "accepted", "event")  # unknown extra field: accepted
    add("impressions", a, "duplicate", "duplicate_line")
    add("impressions", dict(b, ts_ms=b["ts_ms"] + 200), "duplicate", "duplicate_impression_id")
    add("impressions", dumps(impression(day, 4, s + 1, 1))[:40], "quarantined", "malformed_json")
    add("impressions", "[1, 2, 3]", "quarantined", "malformed_json")
    add("impressions", " \r", "blank", "blank_line")  # whitespace only: framing, not a record
    add("impressions", {k: v for k, v in impression(day, 5, s + 1, 1).items() if k != "device"}, "quarantined", "missing_key")
    add("impressions", dict(impression(day, 6, s + 1, 1), surface=None), "quarantined", "missing_key")
    add("impressions", dict(impression(day, 7, s + 1, 1), ts_ms=str(s + 1)), "quarantined", "bad_type")
    add("impressions", dict(impression(day, 8, s + 1, 1), position=True), "quarantined", "bad_type")
    add("impressions", dict(impression(day, 9, s + 1, 1), position=2.5), "quarantined", "bad_type")
    add("impressions", dict(impression(day, 10, s + 1, 1), user_id=[1]), "quarantined", "bad_type")
    add("impressions", dict(impression(day, 11, s + 1, 1), surface="moon"), "quarantined", "unknown_enum")
    add("impressions", dict(impression(day, 12, s + 1, 1), position=0), "quarantined", "position_out_of_range")
    add("impressions", impression(day, 13, s - 5000, 1), "quarantined", "ts_out_of_range")
    add("clicks", click(a, a["ts_ms"] + 60_000, "follow", 10), "accepted", "attributed")
    add("clicks", click(a, a["ts_ms"] + 120_000, "view_details", 20), "duplicate", "duplicate_click")
    add("clicks", click(impression(day, 99, s + 1, 1), s + 2000), "quarantined", "orphan_click")
    add("clicks", click(b, b["ts_ms"] + 2 * 3_600_000), "quarantined", "click_outside_window")
    add("clicks", click(c, c["ts_ms"] - 1000), "quarantined", "click_outside_window")
    add("clicks", dict(click(c, c["ts_ms"] + 1000), dwell_ms="long"), "quarantined", "bad_type")
    add("clicks", dict(click(c, c["ts_ms"] + 1000), click_type="poke"), "quarantined", "unknown_enum")
    add("clicks", {k: v for k, v in click(c, c["ts_ms"] + 1000).items() if k != "click_type"}, "quarantined", "missing_key")
    add("behaviors", behavior(s + 100, 1, 5, "buy"), "accepted", "event")
    add("behaviors", behavior(s + 100, 1, 6, "jump"), "quarantined", "unknown_enum")
    add("behaviors", behavior(s + contracts.DAY_MS + 1, 1, 7), "quarantined", "ts_out_of_range")
    add("behaviors", dict(behavior(s + 100, 1, 8), ts_ms=float(s + 100) + 0.25), "quarantined", "bad_type")
    add("behaviors", '{"user_id": 1, "ts_ms": 5, "item_id": 2', "quarantined", "malformed_json")
    return expected


def test_bad_input_corpus_each_defect_quarantined_with_its_reason(spark, tmp_path):
    day = "2026-02-20"
    expected = _bad_corpus(day)
    lines = {k: [line for kind, line, _, _ in expected if kind == k] for k in landing.FILE_KINDS}
    landing.write_day(tmp_path, day, lines)
    r = run_events_job(spark, tmp_path, day)

    # no row disappears uncounted: per kind input = accepted + quarantined + duplicates
    for kind in landing.FILE_KINDS:
        a = r.accounting[kind]
        blank = sum(1 for k, _, outcome, _ in expected if k == kind and outcome == "blank")
        assert a.blank_lines == blank
        assert a.input_lines == len(lines[kind]) - blank == a.accepted + a.quarantined + a.duplicates, (kind, a)
        want = {}
        for k, _, outcome, reason in expected:
            if k == kind and outcome != "blank":
                want.setdefault(outcome, {}).setdefault(reason, 0)
                want[outcome][reason] += 1
        assert a.accepted_by_reason == want.get("accepted", {}), kind
        assert a.quarantined_by_reason == want.get("quarantined", {}), kind
        assert a.duplicates_by_reason == want.get("duplicates", want.get("duplicate", {})), kind
    assert r.accounting["impressions"].extra_field == 1

    q = read_dir(r.quarantine_path)
    got = sorted(zip(q.kind, q.raw, q.reason))
    want_q = sorted((k, line, reason) for k, line, outcome, reason in expected if outcome == "quarantined")
    assert got == want_q
    assert len(read_dir(r.events_path)) == r.accounting["impressions"].accepted + r.accounting["behaviors"].accepted
    detail = dict(zip(q.raw, q.detail))
    s = landing.day_start_ms(day)
    assert detail[dumps(dict(impression(day, 7, s + 1, 1), ts_ms=str(s + 1)))] == f'ts_ms="{s + 1}"'  # a JSON string
    assert detail[dumps(dict(impression(day, 9, s + 1, 1), position=2.5))] == "position=2.5"
    assert detail[dumps({k: v for k, v in impression(day, 5, s + 1, 1).items() if k != "device"})] == "device"


def test_all_garbage_day_accepts_nothing_and_counts_everything(spark, tmp_path):
    day = "2026-02-21"
    lines = {"impressions": ['{"request_id": 1, "impr'] * 5 + ["not json"] * 3,
             "clicks": ["{}"] * 2, "behaviors": ['{"user_id": 1}']}
    landing.write_day(tmp_path, day, lines)
    r = run_events_job(spark, tmp_path, day)
    assert r.events_rows == 0 and r.accepted == 0
    assert r.accounting["impressions"].quarantined_by_reason == {"malformed_json": 8}
    assert r.accounting["clicks"].quarantined_by_reason == {"missing_key": 2}
    assert r.quarantined == 11 and r.accounting_closes
    table = pq.read_table(r.events_path)
    assert table.num_rows == 0 and table.column_names == list(EVENT_COLUMNS)


def test_rerun_replaces_the_partition_exactly(spark, tmp_path):
    """A rerun replaces the day exactly, and neither run leaves a block behind in the session (the job's
    checkpoints are released when its day ends: the session runs day after day)."""
    world = make_world(tmp_path, start="2026-02-01", n_days=2, n_imps=30, n_beh=10, seed=3)
    day = world.days[0]
    held = spark.sparkContext._jsc.getPersistentRDDs().size()
    r1 = run_events_job(spark, tmp_path, day)
    first = read_dir(r1.events_path)
    first_q = read_dir(r1.quarantine_path)
    (Path(r1.events_path) / "stray.parquet").write_bytes(b"left over from an older run")
    r2 = run_events_job(spark, tmp_path, day)
    assert r2.events_path == r1.events_path
    pd.testing.assert_frame_equal(first, read_dir(r2.events_path))
    pd.testing.assert_frame_equal(first_q, read_dir(r2.quarantine_path))
    assert sorted(p.name for p in Path(r2.events_path).iterdir()) == ["part-00000.parquet"]
    lake = tmp_path / "lake"
    assert sorted(p.name for p in (lake / "events").iterdir()) == [f"date={day}"]
    assert sorted(p.name for p in (lake / "quarantine").iterdir()) == [f"date={day}"]
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == held


def test_crash_mid_write_leaves_the_old_partition(spark, tmp_path):
    base = tmp_path / "lake" / "events"
    ok = spark.range(5).withColumn("x", F.col("id") * 2)
    final = write_partition(ok, base, "2026-02-02")
    before = read_dir(final)
    boom = spark.range(50).withColumn("x", F.when(F.col("id") == 42, F.raise_error(F.lit("disk on fire"))).otherwise(F.col("id")))
    with pytest.raises(Exception, match="disk on fire"):
        write_partition(boom, base, "2026-02-02")
    pd.testing.assert_frame_equal(before, read_dir(final))
    assert sorted(p.name for p in base.iterdir()) == ["date=2026-02-02"], "no temp directory left behind"


def test_landing_problems_are_reported_before_spark_reads(spark, tmp_path):
    day = "2026-02-05"
    landing.write_day(tmp_path, day, {"impressions": [dumps(impression(day, 1, landing.day_start_ms(day) + 1, 1))]})
    d = landing.day_dir(tmp_path, day)
    (d / landing.SUCCESS_MARKER).unlink()
    with pytest.raises(landing.LandingError, match="incomplete"):
        run_events_job(spark, tmp_path, day)
    (d / landing.SUCCESS_MARKER).write_text(json.dumps({"day": day, "files": {}}))
    (d / "clicks-00000.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n')[:-6])
    with pytest.raises(landing.LandingError, match="corrupt gzip"):
        run_events_job(spark, tmp_path, day)
    (d / "clicks-00000.jsonl.gz").write_bytes(b"")
    with pytest.raises(landing.LandingError, match="empty file"):
        run_events_job(spark, tmp_path, day)
    with pytest.raises(landing.LandingError, match="missing"):
        run_events_job(spark, tmp_path, "2026-02-09")


def test_require_next_day(spark, tmp_path):
    day = "2026-02-06"
    landing.write_day(tmp_path, day, {"impressions": [dumps(impression(day, 1, landing.day_start_ms(day) + 1, 1))]})
    with pytest.raises(landing.LandingError, match="2026-02-07 is not complete"):
        run_events_job(spark, tmp_path, day, require_next_day=True)
