"""The landing-zone contract: atomic day writes and clear errors for unusable days."""

from __future__ import annotations

import gzip

import pytest

from transforms import landing


def _day(root, day="2026-01-01", n=3):
    lines = {k: [landing.dumps({"i": i}) for i in range(n)] for k in landing.FILE_KINDS}
    return landing.write_day(root, day, lines)


def test_write_then_open_counts_lines(tmp_path):
    _day(tmp_path, n=5)
    opened = landing.open_day(tmp_path, "2026-01-01")
    assert opened.line_counts == {"impressions": 5, "clicks": 5, "behaviors": 5}
    assert landing.complete_days(tmp_path) == ["2026-01-01"]


def test_rewrite_replaces_the_day_exactly_and_leaves_no_temp(tmp_path):
    _day(tmp_path, n=5)
    _day(tmp_path, n=2)
    assert landing.open_day(tmp_path, "2026-01-01").line_counts["clicks"] == 2
    assert [p.name for p in (tmp_path / "landing").iterdir()] == ["date=2026-01-01"]


def test_failed_write_leaves_no_partial_day(tmp_path):
    def exploding():
        yield "{}"
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        landing.write_day(tmp_path, "2026-01-02", {"impressions": exploding()})
    assert landing.complete_days(tmp_path) == []
    assert list((tmp_path / "landing").iterdir()) == []


def test_day_without_success_marker_is_incomplete(tmp_path):
    path = _day(tmp_path)
    (path / landing.SUCCESS_MARKER).unlink()
    assert landing.complete_days(tmp_path) == []
    with pytest.raises(landing.LandingError, match=r"2026-01-01 is incomplete: .*_SUCCESS does not exist"):
        landing.open_day(tmp_path, "2026-01-01")


def test_missing_day_is_named(tmp_path):
    with pytest.raises(landing.LandingError, match="2026-02-03 is missing"):
        landing.open_day(tmp_path, "2026-02-03")


def test_empty_file_is_named(tmp_path):
    path = _day(tmp_path)
    (path / "clicks-00000.jsonl.gz").write_bytes(b"")
    with pytest.raises(landing.LandingError, match=r"clicks-00000.jsonl.gz: empty file"):
        landing.open_day(tmp_path, "2026-01-01")


def test_corrupt_gzip_is_named(tmp_path):
    path = _day(tmp_path, n=200)
    f = path / "behaviors-00000.jsonl.gz"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(landing.LandingError, match=r"behaviors-00000.jsonl.gz: corrupt gzip"):
        landing.open_day(tmp_path, "2026-01-01")


def test_line_count_mismatch_with_marker_is_named(tmp_path):
    path = _day(tmp_path, n=3)
    with gzip.open(path / "impressions-00000.jsonl.gz", "wt") as fh:
        fh.write("{}\n")
    with pytest.raises(landing.LandingError, match=r"impressions-00000.jsonl.gz: 1 lines but _SUCCESS declares 3"):
        landing.open_day(tmp_path, "2026-01-01")


def test_not_gzip_is_named_without_decompressing(tmp_path):
    path = _day(tmp_path)
    (path / "clicks-00000.jsonl.gz").write_bytes(b'{"a": 1}\n')
    with pytest.raises(landing.LandingError, match=r"clicks-00000.jsonl.gz: corrupt gzip \(not a gzip file.*quarantine-file"):
        landing.open_day(tmp_path, "2026-01-01", verify=False)


def test_quarantine_file_moves_it_with_a_ledger_entry_and_releases_the_day(tmp_path):
    path = _day(tmp_path, n=4)
    target = path / "behaviors-00000.jsonl.gz"
    with pytest.raises(landing.LandingError, match="a reason is required"):
        landing.quarantine_file(tmp_path, target, "  ")
    with pytest.raises(landing.LandingError, match="not a file of a landing day"):
        landing.quarantine_file(tmp_path, tmp_path / "elsewhere.jsonl.gz", "x")
    target.unlink()
    with pytest.raises(landing.LandingError, match="behaviors-00000.jsonl.gz declared in _SUCCESS but not in"):
        landing.open_day(tmp_path, "2026-01-01")  # a file gone without a ledger entry is an error
    _day(tmp_path, n=4)
    entry = landing.quarantine_file(tmp_path, target, "bad upload")
    assert entry["declared_lines"] == 4 and entry["day"] == "2026-01-01" and entry["kind"] == "behaviors"
    assert (tmp_path / entry["moved_to"]).exists() and not target.exists()
    opened = landing.open_day(tmp_path, "2026-01-01")
    assert opened.files["behaviors"] == [] and opened.quarantined_files == [entry]
    assert not opened.declared_empty
