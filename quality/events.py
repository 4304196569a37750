"""Checks of the ``events`` dataset (``lake/events/date=D``), run on the written partition.

Blocking (correctness; severity ERROR, stop downstream assets of the run):

=============================== ==============================================================
``events_not_empty``            at least one event accepted; when it fails the description names
                                the input lines and the quarantine reasons with their counts
``events_schema``               exactly the event columns, with the contract's Arrow types
``events_keys_not_null``        event_kind/user_id/ts_ms/item_id always; impression keys, position,
                                surface, device and label on impressions; action on behaviors
``events_impression_id_unique`` no impression_id twice in the day
``events_position_in_range``    1 <= position <= the slots of the impression's surface
``events_ts_in_day``            ts_ms inside the partition's UTC day; click_ts_ms >= ts_ms
``events_label_binary``         label in {0, 1}; click fields only on clicked impressions
``events_row_accounting``       per file kind: input lines = accepted + quarantined + duplicates
``events_quarantine_rate``      no quarantine reason above ``block_above`` of its kind's input lines,
                                no file with more than ``block_above`` of its lines quarantined
=============================== ==============================================================

Row rules come first: every rule above that judges one row is also a row rule of the events job,
with its own quarantine reason (``transforms.spark.events.QUARANTINE_REASONS``), so a bad row is
quarantined and counted instead of blocking the day; these checks then judge *rates*
(:class:`QuarantineRates`, one config for every reason and file: blocking above, warning above a
lower share). A day the source declares empty (``_SUCCESS`` lists zero lines) passes
``events_not_empty`` and the volume check as a recorded empty partition.

Warnings (drift; severity WARN, never block):

=============================== ==============================================================
``events_ctr_drift``            CTR (mean label of impressions) inside a band around the trailing
                                days' pooled CTR p: p +/- max(band*p, z*sqrt(p(1-p)/n_today))
                                (defaults band 0.5, z 4: relative drift, but never flags noise)
``events_quarantine_warning``   no reason or file above ``warn_above`` (the lower share)
``events_volume_drop``          event rows >= (1 - max_drop) x trailing mean (default max_drop 0.5)
=============================== ==============================================================

Drift checks pass (with "no history" in the description) when no trailing partition exists.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from contracts import DAY_MS, EVENT_COLUMNS
from quality.framework import (CheckDef, CheckOutcome, DatasetChecks, existing_partitions, partition_schema,
                               python_outcome, read_partition, validate_frame)
from transforms.landing import SURFACE_SLOTS

EVENTS_CHECKS = DatasetChecks("events", (
    CheckDef("events_not_empty", "at least one event accepted for the day (names the quarantine reasons when not)"),
    CheckDef("events_schema", "exactly the event table's columns with their types"),
    CheckDef("events_keys_not_null", "keys and required fields are never null"),
    CheckDef("events_impression_id_unique", "impression_id is unique within the day"),
    CheckDef("events_position_in_range", "positions are 1-based slots within their surface's slots"),
    CheckDef("events_ts_in_day", "ts_ms inside the partition's UTC day; clicks not before their impression"),
    CheckDef("events_label_binary", "labels are 0/1 and click fields appear only with label 1"),
    CheckDef("events_row_accounting", "input lines = accepted + quarantined + duplicates for every file kind"),
    CheckDef("events_quarantine_rate", "quarantine share per reason and per file not above the blocking threshold"),
    CheckDef("events_ctr_drift", "CTR inside a band around the trailing days' CTR", blocking=False),
    CheckDef("events_quarantine_warning", "quarantine share per reason and per file not above the warning threshold",
             blocking=False),
    CheckDef("events_volume_drop", "event volume not far below the trailing days' mean", blocking=False),
))


@dataclass(frozen=True)
class RateLimit:
    warn_above: float
    block_above: float


@dataclass(frozen=True)
class QuarantineRates:
    """The one config of quarantine shares: a day blocks above ``block_above``, warns above ``warn_above``.

    ``per_reason``: lines quarantined for one reason / input lines of that file kind (the simulator's
    defects stay below 0.5 % each). ``per_file``: quarantined lines of one file / its input lines.
    Kinds or files with fewer than ``min_lines`` input lines are reported but not judged (one bad
    line among ten is noise, not a broken source).
    """

    per_reason: RateLimit = RateLimit(warn_above=0.02, block_above=0.10)
    per_file: RateLimit = RateLimit(warn_above=0.03, block_above=0.15)
    min_lines: int = 200


@dataclass(frozen=True)
class EventsThresholds:
    ctr_band: float = 0.5
    ctr_z: float = 4.0
    quarantine: QuarantineRates = QuarantineRates()
    volume_drop_max: float = 0.5
    trailing_days: int = 7


@dataclass(frozen=True)
class Trailing:
    days: tuple[str, ...]
    rows: float | None          # mean event rows per day
    ctr: float | None           # pooled CTR (clicked impressions / impressions)


def trailing_stats(events_base: str | Path, day: str, n_days: int = 7) -> Trailing:
    """Rows and CTR of up to ``n_days`` existing partitions before ``day`` (reads two columns only)."""
    d = dt.date.fromisoformat(day)
    wanted = [(d - dt.timedelta(days=k)).isoformat() for k in range(1, n_days + 1)]
    found = existing_partitions(events_base, wanted)
    if not found:
        return Trailing((), None, None)
    rows, imps, clicks = 0, 0, 0
    for _, path in found:
        df = read_partition(path, ["event_kind", "label"])
        rows += len(df)
        imp = df[df["event_kind"] == "impression"]
        imps += len(imp)
        clicks += int(imp["label"].fillna(0).sum())
    return Trailing(tuple(d for d, _ in found), rows / len(found), clicks / imps if imps else None)


def ctr_band(trailing_ctr: float, n_impressions: int, th: "EventsThresholds") -> tuple[float, float]:
    """Allowed CTR range: trailing CTR +/- max(relative band, z binomial standard errors of today's CTR).

    The binomial term keeps small days (tests, a young world, a new surface) from warning on noise.
    """
    p = min(max(trailing_ctr, 0.0), 1.0)
    noise = th.ctr_z * (p * (1 - p) / n_impressions) ** 0.5 if n_impressions else 1.0
    tol = max(th.ctr_band * p, noise)
    return max(p - tol, 0.0), min(p + tol, 1.0)


def _gx_expectations(day: str, th: EventsThresholds, trailing: Trailing, n_impressions: int) -> dict[str, list]:
    import great_expectations as gx
    from great_expectations.expectations.row_conditions import Column

    E = gx.expectations
    imp = {"row_condition": Column("event_kind") == "impression"}
    beh = {"row_condition": Column("event_kind") == "behavior"}
    start = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    exps: dict[str, list] = {
        "events_not_empty": [E.ExpectTableRowCountToBeBetween(min_value=1)],
        "events_schema": [E.ExpectTableColumnsToMatchSet(column_set=list(EVENT_COLUMNS), exact_match=True)],
        "events_keys_not_null": (
            [E.ExpectColumnValuesToNotBeNull(column=c) for c in ("event_kind", "user_id", "ts_ms", "item_id")]
            + [E.ExpectColumnValuesToBeInSet(column="event_kind", value_set=["impression", "behavior"])]
            + [E.ExpectColumnValuesToNotBeNull(column=c, **imp) for c in
               ("request_id", "impression_id", "ad_id", "campaign_id", "advertiser_id", "position", "surface",
                "device", "label")]
            + [E.ExpectColumnValuesToNotBeNull(column="action", **beh)]
        ),
        "events_impression_id_unique": [E.ExpectColumnValuesToBeUnique(column="impression_id")],
        "events_position_in_range": [
            E.ExpectColumnValuesToBeBetween(column="position", min_value=1, max_value=slots,
                                            row_condition=Column("surface") == surface)
            for surface, slots in SURFACE_SLOTS.items()] + [
            E.ExpectColumnValuesToBeInSet(column="surface", value_set=list(SURFACE_SLOTS), **imp)],
        "events_ts_in_day": [
            E.ExpectColumnValuesToBeBetween(column="ts_ms", min_value=start, max_value=start + DAY_MS - 1),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="click_ts_ms", column_B="ts_ms", or_equal=True,
                                                      ignore_row_if="either_value_is_missing"),
        ],
        "events_label_binary": [
            E.ExpectColumnValuesToBeInSet(column="label", value_set=[0, 1]),
            E.ExpectColumnValuesToBeNull(column="click_ts_ms", row_condition=Column("label") == 0),
            E.ExpectColumnValuesToNotBeNull(column="click_ts_ms", row_condition=Column("label") == 1),
            E.ExpectColumnValuesToBeNull(column="click_type", row_condition=Column("label") == 0),
        ],
        "events_ctr_drift": [],
        "events_volume_drop": [],
    }
    if trailing.ctr is not None:
        lo, hi = ctr_band(trailing.ctr, n_impressions, th)
        exps["events_ctr_drift"].append(E.ExpectColumnMeanToBeBetween(column="label", min_value=lo, max_value=hi))
    if trailing.rows is not None:
        exps["events_volume_drop"].append(
            E.ExpectTableRowCountToBeBetween(min_value=int(trailing.rows * (1 - th.volume_drop_max))))
    return exps


def quarantine_breaches(accounting: Mapping[str, Mapping[str, Any]], files: Mapping[str, Mapping[str, Any]],
                        rates: QuarantineRates) -> list[dict]:
    """Every reason share (per kind) and file share above a limit: {"over": "block_above"|"warn_above", "text", ...}."""
    out = []

    def judge(share: float, limit: RateLimit, text: str, **facts) -> None:
        level = "block_above" if share > limit.block_above else "warn_above" if share > limit.warn_above else None
        if level:
            bound = getattr(limit, level)
            out.append({"over": level, "share": share, "limit": bound, **facts,
                        "text": f"{text} {share:.1%} > {bound:.1%}"})

    for kind, a in sorted(accounting.items()):
        lines = int(a.get("input_lines", 0))
        if lines < rates.min_lines:
            continue
        for reason, n in sorted((a.get("quarantined_by_reason") or {}).items()):
            judge(int(n) / lines, rates.per_reason, f"{kind} {reason}: {int(n)} of {lines} lines,",
                  kind=kind, reason=reason, lines=lines, quarantined=int(n))
    for name, f in sorted(files.items()):
        lines = int(f.get("lines", 0))
        if lines >= rates.min_lines and int(f.get("quarantined", 0)):
            judge(int(f["quarantined"]) / lines, rates.per_file, f"file {name}: {int(f['quarantined'])} of {lines} lines quarantined,",
                  file=name, lines=lines, quarantined=int(f["quarantined"]))
    return sorted(out, key=lambda b: -b["share"])


def _reasons_text(by_reason: Mapping[str, int]) -> str:
    return ", ".join(f"{r}={n}" for r, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def validate_events(
    path: str | Path,
    day: str,
    accounting: Mapping[str, Mapping[str, Any]] | None = None,
    thresholds: EventsThresholds = EventsThresholds(),
    trailing: Trailing | None = None,
    files: Mapping[str, Mapping[str, Any]] | None = None,
    declared_empty: bool = False,
) -> list[CheckOutcome]:
    """Run every events check on the written partition at ``path``.

    ``accounting`` is the job's per-kind accounting (``{kind: {"input_lines", "accepted", "quarantined",
    "duplicates", "quarantined_by_reason", "duplicates_by_reason", ...}}``); without it the
    accounting check fails and the quarantine-rate checks are not evaluated. ``files`` is the job's
    per-file count (``{source_file: {"kind", "lines", "quarantined"}}``). ``declared_empty``: the source
    declared the day empty, so an empty partition is the expected, recorded outcome.
    """
    path = Path(path)
    if trailing is None:
        trailing = trailing_stats(path.parent, day, thresholds.trailing_days)
    df = read_partition(path)
    n_impressions = int((df["event_kind"] == "impression").sum()) if "event_kind" in df else 0
    outcomes = validate_frame(df, _gx_expectations(day, thresholds, trailing, n_impressions), suite_name=f"events_{day}")

    # Arrow types of the file itself (GX sees pandas dtypes only).
    schema = partition_schema(path)
    wrong = {c: {"expected": t, "found": schema.get(c)} for c, t in EVENT_COLUMNS.items() if schema.get(c) != t}
    if wrong:
        o = outcomes["events_schema"]
        o.passed = False
        o.evaluated += 1
        o.failures.append(python_outcome("events_schema", False, f"column types differ from the contract: {wrong}",
                                         observed=wrong).failures[0])

    acc = {k: dict(v) for k, v in (accounting or {}).items()}
    input_lines = sum(int(a.get("input_lines", 0)) for a in acc.values())
    quarantined = sum(int(a.get("quarantined", 0)) for a in acc.values())
    duplicates = sum(int(a.get("duplicates", 0)) for a in acc.values())
    q_by_reason: dict[str, int] = {}
    for a in acc.values():
        for r, n in (a.get("quarantined_by_reason") or {}).items():
            q_by_reason[r] = q_by_reason.get(r, 0) + int(n)

    ne = outcomes["events_not_empty"]
    if declared_empty and len(df) == 0:
        outcomes["events_not_empty"] = python_outcome(
            "events_not_empty", True, f"{day}: the source declares the day empty (_SUCCESS lists zero lines): "
            "a recorded empty partition", metadata={"source_declared_empty": True})
    elif not ne.passed:
        if accounting is not None:
            ne.description = (
                f"no events accepted for {day}: 0 of {input_lines} input lines accepted; "
                f"{quarantined} quarantined ({_reasons_text(q_by_reason)}), {duplicates} duplicates")
        else:
            ne.description = f"no events in {path} (0 rows)"
        ne.metadata.update(input_lines=input_lines, quarantined_by_reason=q_by_reason)

    # Row accounting (from the job): every line accepted, quarantined or a duplicate, per kind.
    if accounting is None:
        outcomes["events_row_accounting"] = python_outcome(
            "events_row_accounting", False, "no row accounting was reported for this partition")
    else:
        broken = {k: a for k, a in acc.items()
                  if int(a.get("input_lines", 0)) != int(a.get("accepted", 0)) + int(a.get("quarantined", 0)) + int(a.get("duplicates", 0))}
        text = "; ".join(f"{k}: {a.get('input_lines')} in = {a.get('accepted')} accepted + {a.get('quarantined')} "
                         f"quarantined + {a.get('duplicates')} duplicates" for k, a in sorted(acc.items()))
        outcomes["events_row_accounting"] = python_outcome(
            "events_row_accounting", not broken, ("closes: " if not broken else "DOES NOT close: ") + text,
            metadata={"accounting": acc}, observed=broken or None)
        rows = len(df)
        accepted_events = int(acc.get("impressions", {}).get("accepted", 0)) + int(acc.get("behaviors", {}).get("accepted", 0))
        if rows != accepted_events:
            o = outcomes["events_row_accounting"]
            o.passed = False
            o.description = f"the partition holds {rows} rows but the job accepted {accepted_events} impressions+behaviors"
            o.failures = python_outcome("events_row_accounting", False, o.description, observed=rows).failures

    breaches = quarantine_breaches(acc, files or {}, thresholds.quarantine)
    if accounting is None:
        for name in ("events_quarantine_rate", "events_quarantine_warning"):
            outcomes[name] = python_outcome(name, True, "no row accounting reported: quarantine rates not evaluated")
    else:
        shares = f"{quarantined} of {input_lines} lines quarantined ({_reasons_text(q_by_reason)})"
        for name, word, levels in (("events_quarantine_rate", "blocking", ("block_above",)),
                                   ("events_quarantine_warning", "warning", ("block_above", "warn_above"))):
            over = [b for b in breaches if b["over"] in levels]
            text = "; ".join(b["text"] for b in over)
            outcomes[name] = python_outcome(
                name, not over, f"above the {word} share: {text}" if over else f"shares within limits: {shares}",
                metadata={"quarantined_by_reason": q_by_reason, "breaches": over,
                          "limits": {"per_reason": vars(thresholds.quarantine.per_reason),
                                     "per_file": vars(thresholds.quarantine.per_file),
                                     "min_lines": thresholds.quarantine.min_lines}},
                observed=[b["text"] for b in over] or None)
    ctr_o = outcomes["events_ctr_drift"]
    if trailing.ctr is None:
        ctr_o.description = "no trailing partitions with impressions: CTR drift not evaluated"
    else:
        imps = df[df["event_kind"] == "impression"]
        ctr = float(imps["label"].mean()) if len(imps) else float("nan")
        lo, hi = ctr_band(trailing.ctr, n_impressions, thresholds)
        ctr_o.metadata.update(ctr=ctr, trailing_ctr=trailing.ctr, trailing_days=list(trailing.days), allowed=[lo, hi])
        ctr_o.description = (f"CTR {ctr:.4f} vs trailing {trailing.ctr:.4f} over {len(trailing.days)} day(s), "
                             f"allowed [{lo:.4f}, {hi:.4f}]: {'inside' if ctr_o.passed else 'OUTSIDE'}")
    vol = outcomes["events_volume_drop"]
    if declared_empty and len(df) == 0:
        outcomes["events_volume_drop"] = python_outcome(
            "events_volume_drop", True, "the source declares the day empty: volume not compared")
    elif trailing.rows is None:
        vol.description = "no trailing partitions: volume drop not evaluated"
    else:
        vol.metadata.update(rows=len(df), trailing_rows=trailing.rows, trailing_days=list(trailing.days))
        vol.description = (f"{len(df)} events vs trailing mean {trailing.rows:.0f} over {len(trailing.days)} day(s), "
                           f"max drop {thresholds.volume_drop_max:.0%}: {'ok' if vol.passed else 'DROPPED'}")
    return [outcomes[c] for c in EVENTS_CHECKS.names()]
