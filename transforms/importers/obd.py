"""Open Bandit Dataset (ZOZOTOWN, small version) -> landing zone.

Source files (``--src`` is the folder holding ``random/`` and ``bts/``):
``{policy}/{campaign}/{campaign}.csv`` (logged impressions: unnamed row index, timestamp (UTC, µs),
item_id, position, click, propensity_score, user_feature_0..3, user-item_affinity_*) and
``{policy}/{campaign}/item_context.csv`` (item_id, item_feature_0..3), for campaigns ``all``, ``men``,
``women``. By default the ``random`` (uniform-random logging policy) files are read: their item
assignment is independent of position, so CTR by position is an unbiased position-effect estimate.
``policy="bts"`` reads the Bernoulli-Thompson-Sampling logs instead.

Mapping:

* every logged row -> one **impression** (``request_id`` = ``obd-r{policy}-{campaign}-{index}``,
  ``impression_id`` = ``obd-i{policy}-{campaign}-{index}``, index = the file's row index; OBD rows are
  sampled single impressions, not whole 3-item slates, so each row is its own request);
  ``ts_ms`` = timestamp floored to ms;
* ``click`` = 1 -> also one **click** at ``ts_ms`` + 1 s (clamped to the same UTC day), ``click_type``
  ``view_details``, ``dwell_ms`` null;
* ``position`` = the real display slot: 1 = left, 2 = center, 3 = right;
* ``user_id``: OBD has **no user id**. A pseudo user id ``obd-u{sha1(f0|f1|f2|f3)[:12]}`` is derived from
  the tuple of the four hashed user features, so one "user" is a cohort of real users sharing that
  tuple (about 200-250 tuples per file) and spans campaigns. Sequences built from it are cohort
  sequences, not personal histories;
* ``ad_id`` = ``{campaign}-{item_id}`` (item ids are per-campaign indices), ``campaign_id`` = the OBD
  campaign (``all``/``men``/``women``), ``advertiser_id`` = ``zozotown``;
* ``category_id`` = ``item_feature_1``, ``brand_id`` = ``item_feature_2`` from item_context.csv (hashed
  categorical features; OBD does not say which is category or brand); items absent from
  item_context.csv get ``unknown``. ``item_feature_0`` (price-like), ``item_feature_3``, the
  ``propensity_score`` and the ``user-item_affinity_*`` columns are not landed (no landing field);
* ``surface`` = ``feed`` (the recommendation widget), ``device`` = ``web``: constants, not in the data;
* no behavior lines.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any, Iterable

from transforms.importers.common import (
    UNKNOWN, Accounting, ImportReport, LandingBuffer, SourceDataError, naive_utc_ms, parse_int, read_csv, require_file,
)
from transforms.importers.skeleton import Importer, Selection

DATASET = "obd"
POLICIES = ("random", "bts")
CAMPAIGNS = ("all", "men", "women")
USER_FEATURES = ("user_feature_0", "user_feature_1", "user_feature_2", "user_feature_3")
LOG_COLUMNS = ("timestamp", "item_id", "position", "click") + USER_FEATURES
ITEM_COLUMNS = ("item_id", "item_feature_1", "item_feature_2")


def pseudo_user(features: tuple[str, ...]) -> str:
    return "obd-u" + hashlib.sha1("|".join(features).encode("utf-8")).hexdigest()[:12]


class Obd(Importer):
    dataset = DATASET
    own_options_first = True

    def __init__(self, policy: str, campaigns: tuple[str, ...] | list[str] | str) -> None:
        self.policy, self.requested_campaigns = policy, campaigns

    def locate(self, src: Path) -> None:
        # each campaign's files are looked for as it is read: a corrupt first one is reported before a missing later one
        self.src = src
        if self.policy not in POLICIES:
            raise SourceDataError(f"obd: policy {self.policy!r} is not one of {POLICIES}")
        requested = self.requested_campaigns
        self.campaigns = (tuple(c.strip() for c in requested.split(",")) if isinstance(requested, str)
                          else tuple(requested))
        bad = [c for c in self.campaigns if c not in CAMPAIGNS]
        if bad or not self.campaigns:
            raise SourceDataError(f"obd: campaign(s) {bad or '(none)'} not among {CAMPAIGNS}")

    def read(self, acc: Accounting) -> Iterable[Any]:
        self.logs = []  # (relative file name, campaign, [(idx, ts, item, position, click, user)], items)
        owners: dict[str, tuple[str, ...]] = {}
        for campaign in self.campaigns:
            rel_dir = f"{self.policy}/{campaign}"
            log_path = require_file(self.src, f"{rel_dir}/{campaign}.csv", DATASET)
            ctx_path = require_file(self.src, f"{rel_dir}/item_context.csv", DATASET)
            items: dict[str, tuple[str, str]] = {}
            for line, r in read_csv(ctx_path, ITEM_COLUMNS):
                items[str(parse_int(r["item_id"], ctx_path, line, "item_id"))] = (
                    r["item_feature_1"] or UNKNOWN, r["item_feature_2"] or UNKNOWN)
            acc.source_rows[f"{rel_dir}/item_context.csv"] = len(items)
            rows, seen_idx = [], set()
            for line, r in read_csv(log_path, LOG_COLUMNS):
                idx = r.get("", "") or str(line - 1)
                if idx in seen_idx:
                    raise SourceDataError(
                        f"{log_path} line {line}: row index {idx!r} repeats (impression ids must be unique)")
                seen_idx.add(idx)
                try:
                    when = dt.datetime.fromisoformat(r["timestamp"])
                except ValueError:
                    raise SourceDataError(
                        f"{log_path} line {line}: timestamp {r['timestamp']!r} is not ISO 8601") from None
                position = parse_int(r["position"], log_path, line, "position")
                if position < 1:
                    raise SourceDataError(f"{log_path} line {line}: position {position} is not a 1-based slot")
                click = parse_int(r["click"], log_path, line, "click")
                if click not in (0, 1):
                    raise SourceDataError(f"{log_path} line {line}: click {click} is not 0 or 1")
                feats = tuple(r[c] for c in USER_FEATURES)
                user = pseudo_user(feats)
                if owners.setdefault(user, feats) != feats:  # a 48-bit hash collision: never seen, but never silent
                    raise SourceDataError(f"{log_path} line {line}: pseudo user id {user} collides for {feats}")
                item = str(parse_int(r["item_id"], log_path, line, "item_id"))
                rows.append((idx, naive_utc_ms(when), item, position, click == 1, user))
            rel = f"{rel_dir}/{campaign}.csv"
            acc.source_rows[rel] = len(rows)
            acc.source_rows[f"{rel} [click = 1]"] = sum(1 for r in rows if r[4])
            self.logs.append((rel, campaign, rows, items))
        return (r[5] for _, _, rows, _ in self.logs for r in rows)

    def land(self, selection: Selection, acc: Accounting, buf: LandingBuffer) -> None:
        unknown_items = 0
        for rel, campaign, rows, items in self.logs:
            landed = 0
            clicks_key = f"{rel} [click = 1]"
            for idx, ts, item, position, clicked, user in rows:
                reason = selection.excluded(user, ts)
                if reason:
                    acc.drop_unit(reason, {rel: 1, clicks_key: int(clicked)})
                    continue
                landed += 1
                unit = f"{self.policy}-{campaign}-{idx}"
                request_id, impression_id = f"obd-r{unit}", f"obd-i{unit}"
                ad_id = f"{campaign}-{item}"
                if item not in items:
                    unknown_items += 1
                category, brand = items.get(item, (UNKNOWN, UNKNOWN))
                buf.impression(request_id, impression_id, user, ts, ad_id=ad_id, campaign_id=campaign,
                               advertiser_id="zozotown", category=category, brand=brand, position=position)
                if clicked:
                    buf.click(impression_id, request_id, user, ad_id, ts)
            acc.balance_rows(rel, "impressions", landed)
            acc.expected["impressions"] += acc.kept(rel)
            acc.expected["clicks"] += acc.kept(clicks_key)

        n_users = len({r[5] for _, _, rows, _ in self.logs for r in rows})
        acc.notes.append(
            f"{n_users} pseudo users (distinct user-feature tuples) over {len(self.campaigns)} campaign file(s)")
        if unknown_items:
            acc.notes.append(
                f"{unknown_items} impressions of items absent from item_context.csv: category/brand 'unknown'")

    def options(self) -> dict[str, Any]:
        return {"policy": self.policy, "campaigns": ",".join(self.campaigns) if self.campaigns != CAMPAIGNS else None}


def import_obd(src: str | Path, out: str | Path, limit_users: int | None = None, *, policy: str = "random",
               campaigns: tuple[str, ...] | list[str] | str = CAMPAIGNS,  # or "men,women"
               since: str | None = None, until: str | None = None, fill_gaps: bool = False) -> ImportReport:
    return Obd(policy, campaigns).run(src, out, limit_users, since, until, fill_gaps)
