"""JSON Lines as written in the wild, through the real Spark events job: CRLF, BOM, blank lines,
whitespace, multi-member gzip, 1 MB lines, non-ASCII ids; files that are not gzip; operator release of
a file; source-declared empty days."""

from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq
import pytest

from tests.spark.spark_corpus import behavior, click, impression
from transforms import landing
from transforms.landing import dumps
from transforms.spark.events import run_events_job

pytestmark = pytest.mark.spark

DAY = "2026-07-01"


def land_raw(root, day: str, members: dict[str, list[bytes]]) -> None:
    """Write a landing day from raw bytes: each file is the concatenation of one gzip member per chunk."""
    path = landing.day_dir(root, day)
    path.mkdir(parents=True)
    declared = {}
    for kind in landing.FILE_KINDS:
        name = f"{kind}-00000.jsonl.gz"
        chunks = members.get(kind, [b""])
        (path / name).write_bytes(b"".join(gzip.compress(c, mtime=0) for c in chunks))
        declared[name] = sum(c.count(b"\n") for c in chunks)
    (path / landing.SUCCESS_MARKER).write_text(json.dumps({"day": day, "files": declared}))


def test_json_lines_as_written_in_the_wild_are_all_accepted_ids_byte_exact(spark, tmp_path):
    s = landing.day_start_ms(DAY)
    imps = [impression(DAY, k, s + 1000 * k, user=k) for k in range(6)]
    imps[1]["user_id"] = "użytkownik-ß-用户-😀"                                  # raw UTF-8 in the file
    imps[2]["impression_id"] = "imp-\u00e9t\u00e9"                             # written below as \u escapes
    imps[3]["debug_trace"] = "x" * 1_100_000                                   # a 1.1 MB line (extra field)
    crlf = [dumps(imps[0]).encode() + b"\r\n", json.dumps(imps[1], ensure_ascii=False).encode() + b"\r\n",
            b"\r\n",                                                             # blank line, CRLF
            b"  \t" + json.dumps(imps[2]).encode() + b"   \r\n"]                 # whitespace around, \u escapes
    second_member = [dumps(imps[3]).encode() + b"\n", b"\n", b"   \n",
                     dumps(imps[4]).encode() + b"\n", dumps(imps[5]).encode() + b"\n"]
    clicked = click(imps[1], imps[1]["ts_ms"] + 5000, "follow", 7)
    land_raw(tmp_path, DAY, {
        "impressions": [b"\xef\xbb\xbf" + b"".join(crlf), b"".join(second_member)],   # BOM, then a 2nd gzip member
        "clicks": [b"\xef\xbb\xbf" + json.dumps(clicked, ensure_ascii=False).encode() + b"\r\n"],
        "behaviors": [(dumps(behavior(s + 5, 1, 2)) + "\r\n" + dumps(behavior(s + 6, 1, 3)) + "\r\n").encode()],
    })

    r = run_events_job(spark, tmp_path, DAY)
    assert r.quarantined == 0 and r.duplicates == 0 and r.accounting_closes, r.summary()
    a = r.accounting["impressions"]
    assert (a.input_lines, a.accepted, a.blank_lines, a.extra_field) == (6, 6, 3, 1)
    assert r.accounting["clicks"].accepted_by_reason == {"attributed": 1}
    assert r.accounting["behaviors"].accepted == 2
    events = pq.read_table(r.events_path).to_pylist()
    by_imp = {e["impression_id"]: e for e in events if e["event_kind"] == "impression"}
    assert set(by_imp) == {i["impression_id"] for i in imps}
    assert by_imp[imps[1]["impression_id"]]["user_id"].encode() == "użytkownik-ß-用户-😀".encode()
    assert by_imp[imps[1]["impression_id"]]["label"] == 1
    assert "imp-été".encode() in {k.encode() for k in by_imp}


def test_a_file_that_is_not_gzip_fails_the_day_naming_the_file(spark, tmp_path):
    landing.write_day(tmp_path, DAY, {"impressions": [dumps(impression(DAY, 1, landing.day_start_ms(DAY) + 1, 1))]})
    bad = landing.day_dir(tmp_path, DAY) / "clicks-00000.jsonl.gz"
    bad.write_bytes(b'{"impression_id": "i-1"}\n')  # plain text under a .gz name
    with pytest.raises(landing.LandingError, match=r"clicks-00000.jsonl.gz: corrupt gzip .*quarantine-file"):
        run_events_job(spark, tmp_path, DAY)
    bad.write_bytes(gzip.compress(b'{"impression_id": "i-1"}\n' * 500)[:-40])  # gzip header, truncated body
    with pytest.raises(landing.LandingError, match=r"clicks-00000.jsonl.gz: corrupt gzip"):
        run_events_job(spark, tmp_path, DAY)


def test_operator_sets_a_corrupt_file_aside_and_the_day_reports_it(spark, tmp_path):
    from pipelines.cli import main

    s = landing.day_start_ms(DAY)
    landing.write_day(tmp_path, DAY, {"impressions": [dumps(impression(DAY, k, s + k, 1)) for k in range(3)],
                                      "behaviors": [dumps(behavior(s + 9, 1, 2))]})
    bad = landing.day_dir(tmp_path, DAY) / "clicks-00000.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(landing.LandingError, match="corrupt gzip"):
        run_events_job(spark, tmp_path, DAY)

    assert main(["landing", "quarantine-file", str(bad), "--reason", "ad server bug #123: truncated upload",
                 "--home", str(tmp_path)]) == 0
    assert not bad.exists()
    moved = tmp_path / "lake" / "quarantine_files" / f"date={DAY}" / "clicks-00000.jsonl.gz"
    assert moved.read_bytes() == b"not gzip at all"
    (entry,) = [json.loads(x) for x in (tmp_path / "lake" / "quarantine_files" / "ledger.jsonl").read_text().splitlines()]
    assert entry["file"] == "clicks-00000.jsonl.gz" and entry["reason"] == "ad server bug #123: truncated upload"
    assert entry["declared_lines"] == 0 and entry["kind"] == "clicks"

    r = run_events_job(spark, tmp_path, DAY)
    assert r.impressions == 3 and r.accounting_closes
    assert [e["file"] for e in r.quarantined_files] == ["clicks-00000.jsonl.gz"]
    assert "set aside by an operator: clicks-00000.jsonl.gz" in r.summary()
    assert main(["landing", "quarantine-file", str(bad), "--reason", "again", "--home", str(tmp_path)]) == 2


def test_source_declared_empty_day_is_an_empty_partition(spark, tmp_path):
    landing.write_day(tmp_path, DAY, {})  # every file present, _SUCCESS lists zero lines
    r = run_events_job(spark, tmp_path, DAY)
    assert r.source_declared_empty and r.events_rows == 0 and r.accounting_closes
    assert pq.read_table(r.events_path).num_rows == 0
    other = "2026-07-05"
    path = landing.day_dir(tmp_path, other)
    path.mkdir(parents=True)
    (path / landing.SUCCESS_MARKER).write_text(json.dumps({"day": other, "files": {}}))  # no files at all
    r = run_events_job(spark, tmp_path, other)
    assert r.source_declared_empty and pq.read_table(r.events_path).num_rows == 0
    assert pq.read_table(r.quarantine_path).num_rows == 0
