"""Log defects injected into the clean per-day streams, with an exact manifest of what was injected.

Rules that keep the manifest exact (the events job's row accounting is tested against it):
- a record is destroyed by at most one defect (malformed_json, missing_key or bad_type);
- duplicates (an exact duplicate line, or an impression re-logged with the same impression_id and a
  timestamp 1-500 ms later) are made of clean records only and land in the same file;
- a click whose impression was destroyed is counted as ``orphan_click`` in the file the click lands in;
- ``late_click`` counts click lines whose impression is in the previous day's file: clicks that
  happened after midnight, and clicks that happened on D but were logged into D+1's file (a late
  click whose impression was destroyed counts as ``orphan_click`` only);
- ``extra_field`` counts accepted impression lines carrying the unknown field ``exp_bucket``;
- ``out_of_order`` counts adjacent swaps after all other defects (lines stay in their file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from transforms import landing
from transforms.simulator.world import DefectRates

COUNTERS = (
    "lines", "duplicate_line", "duplicate_impression_id", "malformed_json", "missing_key", "bad_type",
    "orphan_click", "late_click", "extra_field", "out_of_order",
)
DESTROYING = ("malformed_json", "missing_key", "bad_type")
EXTRA_FIELD = "exp_bucket"
# Non-integer values given to integer fields: words, booleans and fractions.
BAD_VALUES = ("soon", True, 2.5, "12:30", False)


@dataclass
class FileDefects:
    counts: dict[str, int]
    lines: list[str]


def choose_destroyed(records: list[dict], rates: DefectRates, rng: np.random.Generator) -> list[str | None]:
    """The destroying defect of each record (None for a clean record)."""
    u = rng.random(len(records))
    t1 = rates.malformed_json
    t2 = t1 + rates.missing_key
    t3 = t2 + rates.bad_type
    return [
        "malformed_json" if x < t1 else "missing_key" if x < t2 else "bad_type" if x < t3 else None
        for x in u
    ]


def corrupt(record: dict, kind: str, defect: str, rng: np.random.Generator) -> str:
    if defect == "malformed_json":
        line = landing.dumps(record)
        return line[: int(rng.integers(1, len(line) - 1))]
    broken = dict(record)
    if defect == "missing_key":
        keys = [k for k in landing.REQUIRED_KEYS[kind] if k in broken]
        del broken[keys[int(rng.integers(len(keys)))]]
    else:
        keys = [k for k in landing.INTEGER_KEYS[kind] if broken.get(k) is not None]
        broken[keys[int(rng.integers(len(keys)))]] = BAD_VALUES[int(rng.integers(len(BAD_VALUES)))]
    return landing.dumps(broken)


def inject(
    kind: str,
    records: list[dict],
    destroyed: list[str | None],
    rates: DefectRates,
    rng: np.random.Generator,
    orphan: list[bool] | None = None,
    late: list[bool] | None = None,
    extra_field: bool = False,
) -> FileDefects:
    """Serialise one file's records (in time order) with defects; count exactly what was done."""
    counts = dict.fromkeys(COUNTERS, 0)
    lines: list[str] = []
    pending: list[tuple[int, str]] = []  # (insert before output index, line) for delayed duplicates
    for i, (record, defect) in enumerate(zip(records, destroyed)):
        if extra_field and kind == "impressions":
            record = {**record, EXTRA_FIELD: f"b{int(rng.integers(8))}"}
        if defect is not None:
            lines.append(corrupt(record, kind, defect, rng))
            counts[defect] += 1
            continue
        line = landing.dumps(record)
        lines.append(line)
        if orphan is not None and orphan[i]:
            counts["orphan_click"] += 1
        if late is not None and late[i] and not (orphan is not None and orphan[i]):
            counts["late_click"] += 1
        if extra_field and kind == "impressions":
            counts["extra_field"] += 1
        if rng.random() < rates.duplicate_line:
            pending.append((len(lines) + int(rng.integers(0, 20)), line))
            counts["duplicate_line"] += 1
        if kind == "impressions" and rng.random() < rates.duplicate_impression_id:
            relogged = {**record, "ts_ms": record["ts_ms"] + int(rng.integers(1, 501))}
            pending.append((len(lines) + int(rng.integers(0, 20)), landing.dumps(relogged)))
            counts["duplicate_impression_id"] += 1
        pending = _flush(lines, pending)
    lines.extend(line for _, line in sorted(pending, key=lambda p: p[0]))
    for j in range(len(lines) - 1):
        if rng.random() < rates.out_of_order:
            lines[j], lines[j + 1] = lines[j + 1], lines[j]
            counts["out_of_order"] += 1
    counts["lines"] = len(lines)
    return FileDefects(counts, lines)


def _flush(lines: list[str], pending: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Append the duplicates whose turn has come; return those still waiting."""
    waiting = []
    for target, line in pending:
        if target <= len(lines):
            lines.append(line)
        else:
            waiting.append((target, line))
    return waiting


def manifest_totals(files: dict[str, dict[str, dict[str, int]]]) -> dict[str, int]:
    totals = dict.fromkeys(COUNTERS, 0)
    for kinds in files.values():
        for counts in kinds.values():
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
    return totals


def dump_manifest(manifest: dict) -> str:
    return json.dumps(manifest, indent=1, sort_keys=True)
