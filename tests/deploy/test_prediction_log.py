"""The prediction log's writer on its own: daily files by the request's time, rotation, the size bound
(never deleting a file a writer holds open), and drops that are counted, never silent."""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter

import orjson

from contracts import DAY_MS
from deploy.prediction_log import QUEUE_FULL, WRITE_ERROR, LogLimits, PredictionLog, prune, read_day

JAN_1 = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)


def _record(i: int, ts_ms: int) -> dict:
    return {"request_id": f"r{i}", "ts_ms": ts_ms, "user_id": "u", "scores": [[0.1, 0.05]] * 3}


class Counts:
    def __init__(self):
        self.dropped, self.written = Counter(), 0

    def drop(self, reason: str, n: int) -> None:
        self.dropped[reason] += n

    def write(self, n: int) -> None:
        self.written += n


def _log(directory, counts: Counts, **limits) -> PredictionLog:
    return PredictionLog(directory, LogLimits(**limits), on_drop=counts.drop, on_write=counts.write)


def test_records_land_in_the_file_of_their_request_day_and_rotate(tmp_path):
    counts = Counts()
    plog = _log(tmp_path, counts, file_bytes=200, batch_records=1)
    plog.start()
    for i in range(20):  # a request's day is its time's, whatever the clock says
        assert plog.submit(_record(i, JAN_1 + (i % 2) * DAY_MS + 1000 * i))
    plog.close()
    jan1, jan2 = read_day(tmp_path, "2026-01-01"), read_day(tmp_path, "2026-01-02")
    assert sorted(r["request_id"] for r in jan1) == sorted(f"r{i}" for i in range(0, 20, 2))
    assert sorted(r["request_id"] for r in jan2) == sorted(f"r{i}" for i in range(1, 20, 2))
    files = sorted(tmp_path.glob("date=2026-01-01/*.jsonl"))
    assert len(files) > 1 and all(f.name.startswith(f"predictions-{os.getpid()}-") for f in files)
    longest = max(len(orjson.dumps(r)) + 1 for r in jan1)
    assert all(f.stat().st_size < 200 + longest for f in files)  # rotated at the first write past the limit
    assert counts.written == 20 and not counts.dropped


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path):
    counts = Counts()
    plog = _log(tmp_path, counts, queue_records=3)
    accepted = [plog.submit(_record(i, JAN_1)) for i in range(5)]  # the writer is not running yet: nobody drains
    assert accepted == [True, True, True, False, False] and counts.dropped == {QUEUE_FULL: 2}
    plog.start()
    plog.flush()
    assert counts.written == 3 and len(read_day(tmp_path, "2026-01-01")) == 3
    plog.close()


def test_a_failed_write_drops_and_counts_and_the_writer_carries_on(tmp_path):
    counts = Counts()
    blocked = tmp_path / "log"
    blocked.write_text("a file where the log's directory should be")
    plog = _log(blocked, counts)
    plog.start()
    plog.submit(_record(0, JAN_1))
    plog.flush()
    assert counts.dropped == {WRITE_ERROR: 1} and counts.written == 0
    blocked.unlink()  # the operator frees the path: the next records are written
    plog.submit(_record(1, JAN_1))
    plog.close()
    assert counts.written == 1 and [r["request_id"] for r in read_day(blocked, "2026-01-01")] == ["r1"]


def test_the_bound_deletes_the_oldest_files_but_never_one_held_open(tmp_path):
    old = []
    for day in range(1, 5):
        f = tmp_path / f"date=2026-01-0{day}" / f"predictions-1-x-{day:05d}.jsonl"
        f.parent.mkdir()
        f.write_bytes(b"x" * 1000)
        os.utime(f, (day, day))  # modification order = day order
        old.append(f)
    counts = Counts()
    plog = _log(tmp_path, counts, total_bytes=2500)
    plog.start()
    plog.submit(_record(0, JAN_1 + 9 * DAY_MS))  # opens a file: the writer prunes
    plog.flush()
    assert [f.exists() for f in old] == [False, False, True, True]
    held = next(tmp_path.glob("date=2026-01-10/*.jsonl"))
    assert prune(tmp_path, 0) == old[2:] and held.exists()  # open by the running writer: kept
    plog.close()
    assert prune(tmp_path, 0) == [held]
