"""Assertions shared by the hand-made corpus tests and the simulator tiny-world test."""

from __future__ import annotations

QUARANTINE_DEFECTS = ("malformed_json", "missing_key", "bad_type")


def expected_vs_actual(manifest: dict, day: str, accounting: dict) -> dict[str, tuple[int, int]]:
    """(expected, actual) for every counter that must match the manifest exactly; only mismatches."""
    files = manifest["files"][day]
    out: dict[str, tuple[int, int]] = {}
    for kind, m in files.items():
        a = accounting[kind]
        a = a if isinstance(a, dict) else vars(a)
        q, d, acc = a["quarantined_by_reason"], a["duplicates_by_reason"], a["accepted_by_reason"]
        pairs = {
            "lines": (m["lines"], a["input_lines"]),
            "duplicate_line": (m.get("duplicate_line", 0), d.get("duplicate_line", 0)),
            "duplicate_impression_id": (m.get("duplicate_impression_id", 0), d.get("duplicate_impression_id", 0)),
            "duplicate_click": (0, d.get("duplicate_click", 0)),
            "orphan_click": (m.get("orphan_click", 0), q.get("orphan_click", 0)),
            "extra_field": (m.get("extra_field", 0), a["extra_field"]),
            "quarantined_total": (sum(m.get(r, 0) for r in QUARANTINE_DEFECTS) + m.get("orphan_click", 0), a["quarantined"]),
            "duplicates_total": (m.get("duplicate_line", 0) + m.get("duplicate_impression_id", 0), a["duplicates"]),
            "closes": (a["input_lines"], a["accepted"] + a["quarantined"] + a["duplicates"]),
        }
        for r in QUARANTINE_DEFECTS:
            pairs[r] = (m.get(r, 0), q.get(r, 0))
        if kind == "clicks":
            pairs["late_click"] = (m.get("late_click", 0), acc.get("attributed_previous_day", 0))
        for name, (e, got) in pairs.items():
            if e != got:
                out[f"{day}/{kind}/{name}"] = (e, got)
    return out
