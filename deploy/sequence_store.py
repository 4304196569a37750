"""Read side of the sequence store for serving: each user's newest events, from the lake.

``lake/user_sequences/date=D/`` holds the events that day D appended to every user's sequence (with a
strictly increasing ``seq_index``); a user's state as of the newest built day is the tail of the
concatenation. The service keeps, per user, the newest ``max_events`` (the served student's max_len;
older events would be cut by tokenisation anyway) in one in-memory frame, and reloads when a newer
partition lands. It never opens the DuckDB warehouse, whose single writer is the pipeline.

At production scale the same partitions feed a key-value store; this class is the local stand-in
with the same contract (user -> newest events, as of a named day).
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

COLUMNS = ["user_id", "seq_index", "ts_ms", "event_kind", "request_id", "impression_id", "item_id", "campaign_id",
           "advertiser_id", "category_id", "brand_id", "position", "surface", "device", "action", "label",
           "click_type", "dwell_ms"]


class SequenceStore:
    def __init__(self, lake: Path, max_events: int):
        self.root = Path(lake) / "user_sequences"
        self.max_events = int(max_events)
        self.as_of: str | None = None
        self._events = pd.DataFrame(columns=COLUMNS)
        self._rows: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _days(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name.split("=", 1)[1] for p in self.root.glob("date=*")
                      if p.is_dir() and any(p.glob("*.parquet")))

    def refresh(self) -> bool:
        """Reload if a newer day was built (or the store was rebuilt down to fewer days); True if reloaded."""
        days = self._days()
        newest = days[-1] if days else None
        if newest == self.as_of:
            return False
        if not days:
            events = pd.DataFrame(columns=COLUMNS)
        else:
            files = [str(f) for d in days for f in sorted((self.root / f"date={d}").glob("*.parquet"))]
            events = ds.dataset(files, format="parquet").to_table(columns=COLUMNS).to_pandas()
            events = events.sort_values(["user_id", "seq_index"], kind="stable")
            age = events.groupby("user_id", sort=False).cumcount(ascending=False)
            events = events[age < self.max_events].reset_index(drop=True)
        users = events["user_id"].astype(str).to_numpy()
        bounds = np.r_[np.flatnonzero(np.r_[True, users[1:] != users[:-1]]) if len(users) else [], len(users)]
        bounds = bounds.astype(np.int64)
        rows = {str(users[a]): (int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])}
        with self._lock:
            self._events, self._rows, self.as_of = events, rows, newest
        return True

    def history(self, user_id: str) -> pd.DataFrame | None:
        """The user's newest events, oldest first; None if the store has never seen the user."""
        with self._lock:
            span = self._rows.get(user_id)
            return None if span is None else self._events.iloc[span[0]:span[1]]

    @property
    def n_users(self) -> int:
        return len(self._rows)
