"""The seeded ad-world simulator: writes the landing zone, an oracle table and a defect manifest.

Output under ``out`` (a data root such as GENRANK_HOME)::

    landing/date=D/{impressions,clicks,behaviors}-00000.jsonl.gz + _SUCCESS   (what the pipeline reads)
    simulator/oracle/date=D/oracle.parquet   (true click probabilities; the pipeline never reads it)
    simulator/manifest.json                  (config, per-file line and defect counts, summary)

The oracle has, per impression: ``p_click`` (the true probability given everything that happened
before the impression), ``p_click_serving`` (the same model evaluated on what a server can see:
nothing newer than one hour), ``p_relevance`` (before position bias), ``clicked`` (the drawn outcome)
and ``logged`` (False when a defect destroyed the impression line).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from transforms import landing
from contracts import DAY_MS, layout
from transforms.atomic import staged_dir, staged_file
from transforms.simulator import defects
from transforms.simulator.users import EFFECTS, simulate_user
from transforms.simulator.world import PRESETS, Catalog, WorldConfig

# The oracle's rows become a DataFrame this many at a time: one per user cost more than a tenth of the
# simulator's time (a construction's fixed cost), all at once would hold every row as a tuple (GBs on `large`).
ORACLE_CHUNK_ROWS = 200_000
ORACLE_COLUMNS = ("impression_id", "request_id", "user_id", "ts_ms", "ad_id", "surface", "position",
                  "p_click", "p_click_serving", "p_relevance", "clicked")


class SimulationError(ValueError):
    pass


@dataclass
class SimulationReport:
    preset: str
    seed: int
    days: list[str]
    users: int
    impressions: int
    clicks: int
    behaviors: int
    defects: dict[str, int]
    clicks_beyond_range: int
    oracle_auc: float
    oracle_auc_serving: float
    seconds: float
    out: Path
    # the full-information oracle's AUC minus its AUC with one effect's term taken out of the click logit, for
    # each effect that is on: how much of the ranking each effect makes
    effect_shares: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def ctr(self) -> float:
        return self.clicks / max(self.impressions, 1)

    def summary(self) -> str:
        lines = [
            f"simulated world '{self.preset}' (seed {self.seed}) -> {self.out}",
            f"  days        {self.days[0]} .. {self.days[-1]} ({len(self.days)})",
            f"  users       {self.users:,}",
            f"  impressions {self.impressions:,}",
            f"  clicks      {self.clicks:,}  (CTR {self.ctr:.2%})",
            f"  behaviors   {self.behaviors:,}",
            "  defects     " + ", ".join(f"{k}={v:,}" for k, v in self.defects.items() if k != "lines"),
            f"  oracle AUC  {self.oracle_auc:.4f} (full information), {self.oracle_auc_serving:.4f} (serving: nothing newer than 1 h)",
            "  effects     the oracle's AUC without each: "
            + ", ".join(f"{name} -{share:.4f}" for name, share in self.effect_shares.items()),
            f"  took        {self.seconds:.1f} s",
        ]
        return "\n".join(lines)


def resolve_config(preset: str, **overrides) -> WorldConfig:
    if preset not in PRESETS:
        raise SimulationError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[preset], **overrides) if overrides else PRESETS[preset]


def check_shift_day(shift_day: str | None, days: list[str]) -> None:
    """A shift must fall on a simulated day after the first: the days before it are what it drifts from."""
    if shift_day is None:
        return
    try:
        dt.date.fromisoformat(shift_day)
    except ValueError:
        raise SimulationError(f"--shift-day {shift_day!r} is not an ISO date (YYYY-MM-DD)") from None
    if shift_day not in days[1:]:
        raise SimulationError(f"--shift-day {shift_day}: choose a simulated day after the first "
                              f"({days[1] if len(days) > 1 else 'none: simulate at least 2 days'}"
                              f"{'..' + days[-1] if len(days) > 2 else ''}), so the world has days to drift from")


def simulate(preset: str = "tiny", seed: int = 0, out: str | os.PathLike = ".genrank",
             config: WorldConfig | None = None) -> SimulationReport:
    started = time.perf_counter()
    cfg = config or resolve_config(preset)
    out = Path(out)
    days = [(dt.date.fromisoformat(cfg.start_date) + dt.timedelta(days=i)).isoformat() for i in range(cfg.n_days)]
    day_index = {d: i for i, d in enumerate(days)}
    first_ms = landing.day_start_ms(days[0])

    def day_of(ts_ms: int) -> str:
        """The UTC day of a record's time, by integer division inside the world (landing.day_of_ms, a datetime
        per record, was a few % of the simulator's time); a click after the world's last day names its own."""
        i = (ts_ms - first_ms) // DAY_MS
        return days[i] if 0 <= i < len(days) else landing.day_of_ms(ts_ms).isoformat()

    check_shift_day(cfg.shift_day, days)
    catalog = Catalog.build(cfg, seed)

    oracle: list[pd.DataFrame] = []
    oracle_rows: list[tuple] = []
    effects: list[np.ndarray] = []
    clicked_impression_day: dict[str, str] = {}   # the day of each clicked impression (its click may land later)
    clicks_beyond_range = behaviors = 0
    rates = cfg.defects
    files: dict[str, dict[str, dict[str, int]]] = {}
    out.mkdir(parents=True, exist_ok=True)   # the spill lies in the data root, which holds the world anyway
    with tempfile.TemporaryDirectory(prefix=".simulator-spill-", dir=out) as tmp, \
            _DaySpill(Path(tmp)) as spill:
        # Users are simulated over every day at once; their records go to disk by day and file, so that only one
        # day's records are ever held (the `large` world's 7 M lines as dicts were 7 GB).
        for user in range(1, cfg.n_users + 1):
            stream = simulate_user(cfg, catalog, seed, user)
            clicked = {rec["impression_id"] for rec in stream.clicks}
            by_day: dict[tuple[str, str], list[dict]] = {}
            for kind, recs in (("impressions", stream.impressions), ("behaviors", stream.behaviors),
                               ("clicks", stream.clicks)):
                for rec in recs:
                    d = day_of(rec["ts_ms"])
                    if kind == "clicks" and d not in day_index:
                        clicks_beyond_range += 1
                        continue
                    by_day.setdefault((d, kind), []).append(rec)
                    if kind == "impressions" and rec["impression_id"] in clicked:
                        clicked_impression_day[rec["impression_id"]] = d
            spill.add(by_day)
            behaviors += len(stream.behaviors)
            oracle_rows += stream.oracle
            if stream.oracle:
                effects.append(np.concatenate(stream.effects))
            if oracle_rows and (len(oracle_rows) >= ORACLE_CHUNK_ROWS or user == cfg.n_users):
                oracle.append(pd.DataFrame(oracle_rows, columns=list(ORACLE_COLUMNS)))
                oracle_rows = []

        # Day by day, in order: what a day's files need of the days before it is carried (the clicks logged late
        # into it, the impressions destroyed before it), so the draws are those of one pass over every day at once.
        late_rng = np.random.default_rng([seed, 2])
        logged_late: list[dict] = []       # clicks of the previous day written into this day's file
        destroyed_impressions: set[str] = set()
        for i, d in enumerate(days):
            records = {kind: spill.load(d, kind) for kind in landing.FILE_KINDS}
            on_time = []
            carried, logged_late = logged_late, []
            for rec in records["clicks"]:
                (logged_late if late_rng.random() < rates.late_logged_click else on_time).append(rec)
            records["clicks"] = carried + on_time
            for kind in landing.FILE_KINDS:
                records[kind].sort(key=lambda r: r["ts_ms"])
            destroyed = {kind: defects.choose_destroyed(records[kind], rates, np.random.default_rng([seed, 3, i, len(kind)]))
                         for kind in landing.FILE_KINDS}
            destroyed_impressions.update(
                r["impression_id"] for r, x in zip(records["impressions"], destroyed["impressions"]) if x)
            files[d] = {}
            lines = {}
            for kind in landing.FILE_KINDS:
                recs = records[kind]
                orphan = late = None
                if kind == "clicks":
                    orphan = [r["impression_id"] in destroyed_impressions for r in recs]
                    late = [clicked_impression_day[r["impression_id"]] != d for r in recs]
                result = defects.inject(kind, recs, destroyed[kind], rates,
                                        np.random.default_rng([seed, 4, i, len(kind)]), orphan=orphan, late=late,
                                        extra_field=i >= rates.extra_field_from_day)
                files[d][kind] = result.counts
                lines[kind] = result.lines
            landing.write_day(out, d, lines)
        clicks_beyond_range += len(logged_late)   # the last day's late clicks belong to a file after the world

    oracle_df = pd.concat(oracle, ignore_index=True) if oracle else pd.DataFrame(columns=list(ORACLE_COLUMNS))
    oracle_df["logged"] = ~oracle_df["impression_id"].isin(destroyed_impressions)
    _write_oracle(out, oracle_df)
    auc_full, auc_serving = oracle_aucs(oracle_df)
    on = [name for name in EFFECTS if getattr(cfg.strengths, name)]
    shares = effect_shares(np.concatenate(effects) if effects else np.zeros((0, 2 + len(EFFECTS))),
                           oracle_df["clicked"].to_numpy(), on)
    totals = defects.manifest_totals(files)
    report = SimulationReport(
        preset=preset, seed=seed, days=days, users=cfg.n_users, impressions=len(oracle_df),
        clicks=int(oracle_df["clicked"].sum()), behaviors=behaviors,
        defects=totals, clicks_beyond_range=clicks_beyond_range, oracle_auc=auc_full,
        oracle_auc_serving=auc_serving, seconds=time.perf_counter() - started, out=out, effect_shares=shares,
    )
    _write_manifest(out, cfg, report, files)
    return report


class _DaySpill:
    """Records on disk by (day, file kind): ``add`` appends a user's lists, ``load`` reads a day's back in the
    order they were added. Pickle, in a private temporary folder this process made and removes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.handles: dict[tuple[str, str], object] = {}

    def __enter__(self) -> "_DaySpill":
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles.values():
            handle.close()

    def add(self, by_day: dict[tuple[str, str], list[dict]]) -> None:
        for key, records in by_day.items():
            if key not in self.handles:
                self.handles[key] = open(self.folder / f"{key[0]}-{key[1]}.pickle", "ab")
            pickle.dump(records, self.handles[key], protocol=pickle.HIGHEST_PROTOCOL)

    def load(self, day: str, kind: str) -> list[dict]:
        handle = self.handles.pop((day, kind), None)
        if handle is None:
            return []
        handle.close()
        records: list[dict] = []
        with open(self.folder / f"{day}-{kind}.pickle", "rb") as f:
            while True:
                try:
                    records.extend(pickle.load(f))
                except EOFError:
                    break
        (self.folder / f"{day}-{kind}.pickle").unlink()
        return records


def oracle_aucs(oracle_df: pd.DataFrame) -> tuple[float, float]:
    from sklearn.metrics import roc_auc_score

    y = oracle_df["clicked"].to_numpy()
    if y.min() == y.max():
        return float("nan"), float("nan")
    return float(roc_auc_score(y, oracle_df["p_click"])), float(roc_auc_score(y, oracle_df["p_click_serving"]))


def effect_shares(effects: np.ndarray, clicked: np.ndarray, names: list[str]) -> dict[str, float]:
    """For each named effect, the oracle's AUC minus its AUC without that effect's term. ``effects``: a row per
    impression of UserStream.effects (examination, full logit, each of EFFECTS' terms)."""
    from sklearn.metrics import roc_auc_score

    if clicked.min(initial=0) == clicked.max(initial=0):
        return {name: float("nan") for name in names}
    exam, logit = effects[:, 0], effects[:, 1]
    auc = roc_auc_score(clicked, exam / (1 + np.exp(-logit)))
    return {name: float(auc - roc_auc_score(clicked, exam / (1 + np.exp(-(logit - effects[:, 2 + EFFECTS.index(name)])))))
            for name in names}


def _write_oracle(out: Path, oracle_df: pd.DataFrame) -> None:
    with staged_dir(out / "simulator" / "oracle") as staging:
        for day_number, part in oracle_df.groupby(oracle_df["ts_ms"] // DAY_MS, sort=True):   # UTC days
            target = layout.day_dir(staging, landing.day_of_ms(int(day_number) * DAY_MS).isoformat())
            target.mkdir()
            part.to_parquet(target / "oracle.parquet", index=False)


def _write_manifest(out: Path, cfg: WorldConfig, report: SimulationReport, files: dict) -> None:
    path = out / "simulator" / "manifest.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    # Days landed by an earlier, longer simulation into the same root would be read as part of this
    # world: remove them, and only them.
    for stale in set(previous.get("days", ())) - set(report.days):
        shutil.rmtree(landing.day_dir(out, stale), ignore_errors=True)
    manifest = {
        "preset": report.preset,
        "seed": report.seed,
        "config": dataclasses.asdict(cfg),
        "days": report.days,
        "files": files,
        "totals": report.defects,
        "clicks_beyond_range": report.clicks_beyond_range,
        "summary": {
            "users": report.users, "impressions": report.impressions, "clicks": report.clicks,
            "behaviors": report.behaviors, "oracle_auc": report.oracle_auc,
            "oracle_auc_serving": report.oracle_auc_serving, "effect_shares": report.effect_shares,
        },
    }
    with staged_file(path) as tmp:
        tmp.write_text(defects.dump_manifest(manifest))
