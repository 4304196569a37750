"""`genrank status`: what the on-call engineer needs without opening a UI: which landed days are done
(with the challenger the gates refused on the day, if one was: a decision, not a failure), waiting, running,
blocked (with the failing check) or not run yet, the registry's champion, challenger and previous with their
out-of-time AUC and age, the teacher that serves, and the online store's day.
Exit code 0, 1 when a landed day is blocked, 2 when there is no landing zone."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from assets import partitions
from contracts import layout, settings
from pipelines import operating
from pipelines.runner import local_dagster_home
from transforms import landing_watch

STATE_LABELS = {"done": "processed", "running": "running", "blocked": "BLOCKED", "waiting": "waiting",
                "new": "landed, not run yet"}


def status(home: Path) -> tuple[str, int]:
    """The report and the exit code."""
    if not layout.landing(home).is_dir():
        return (f"no landing zone at {home / 'landing'}: land days first (`genrank simulate`, `genrank import`, "
                "or an ad server writing landing/date=YYYY-MM-DD/)"), 2
    import dagster as dg

    found = landing_watch.scan(home)
    instance = dg.DagsterInstance.from_config(str(local_dagster_home(home)))
    now = dt.datetime.now(dt.timezone.utc)
    statuses = list(operating.day_statuses(instance, home, now, settings.late_grace_hours(), found.complete,
                                           set(found.complete)))
    lines = [f"genrank status of {home}", f"Landing: {len(found.complete)} complete day(s)"
             + (f", {found.complete[0]} .. {found.complete[-1]}" if found.complete else "")]
    lines += [f"  skipped: {p}" for p in found.problems]
    partitions.pin_start_date(home)
    try:
        partitions.check_days_in_partitions(found.complete)
    except ValueError as outside:
        lines.append(f"  not daily partitions: {outside}")
    for s in statuses:
        note = _refusal(instance, s.day) if s.state == "done" else s.why
        lines.append(f"  {s.day}  {STATE_LABELS[s.state]:20s} {note}".rstrip())
    lines.append("Registry:")
    lines += _registry_lines(home, now)
    lines.append(f"Online store: {_store_line(home)}")
    blocked = [s.day for s in statuses if s.state == "blocked"]
    if blocked:
        lines.append(f"{len(blocked)} blocked day(s): {', '.join(blocked)}; {operating.RELEASE_HINT}")
    return "\n".join(lines), 1 if blocked else 0


def _refusal(instance, day: str) -> str:
    """'challenger vN refused: reasons' when day's promotion kept the champion, else ''."""
    import dagster as dg

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("promotion"), asset_partitions=[day]), limit=1).records
    meta = records[0].asset_materialization.metadata if records else {}
    if "decision" not in meta or meta["decision"].value != "refused":
        return ""
    return f"challenger v{meta['challenger_version'].value} refused: {meta['reasons'].value}"


def _registry_lines(home: Path, now: dt.datetime) -> list[str]:
    from deploy import registry as reg

    r = reg.default_registry(home)
    lines = []
    for name, alias in ((reg.CTR, "champion"), (reg.CTR, "challenger"), (reg.CTR, "previous"), (reg.TEACHER, "current")):
        version = r.by_alias(name, alias)
        if version is None:
            lines.append(f"  {name}@{alias}: none")
            continue
        age = now - dt.datetime.fromtimestamp(version.creation_timestamp / 1000, dt.timezone.utc)
        tags = version.tags
        figures = (f"out-of-time AUC {tags['oot_auc']}" if "oot_auc" in tags else
                   f"trained on {tags['window']}" if "window" in tags else f"trained on {tags.get('partition', '?')}")
        lines.append(f"  {name}@{alias}: v{version.version}, {figures}, "
                     f"{tags.get('gate_decision', 'not yet judged') if name == reg.CTR else 'serving the logits'}, "
                     f"registered {_age(age)} ago")
    return lines


def _store_line(home: Path) -> str:
    from deploy.sequence_store import StoreUnavailable, open_store

    try:
        store = open_store(settings.online_store(), home)
        try:
            meta = store.meta()
        finally:
            store.close()
    except (StoreUnavailable, OSError, ValueError) as exc:
        return f"unavailable ({exc})"
    except Exception as exc:  # a backend's own error (lmdb, redis): reported, never a crash of the command
        return f"unavailable ({type(exc).__name__}: {exc})"
    return f"as of {meta.as_of}, {meta.users:,} users, newest {meta.max_events} events each"


def _age(delta: dt.timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"
