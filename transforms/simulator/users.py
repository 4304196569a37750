"""One user's clean event stream over the simulated range, with the true click probabilities.

Each user draws from their own random stream (seeded by (seed, user)), so the world is deterministic
for a seed whatever the order users are generated in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from contracts import ACTIONS, CLICK_TYPES, DAY_MS
from transforms import landing
from transforms.simulator.world import SHIFT, SURFACE_SHARE, SURFACE_SLOTS, Catalog, WorldConfig

HOUR_MS = 3_600_000
SERVING_DELAY_MS = HOUR_MS  # the serving oracle sees nothing newer than this
SESSION_MEMORY_MS = 3 * HOUR_MS
ACTION_PROBS = (0.84, 0.07, 0.06, 0.03)  # in contracts.ACTIONS order: view, cart, fav, buy
MEMORY_WEIGHT = {"fav": 0.6, "cart": 1.0, "buy": 1.5}
BRAND_ACT = {"cart": 1, "buy": -1}   # the abandonment term: a cart not (yet) followed by a buy lifts the brand
SURFACES = tuple(SURFACE_SHARE)
SURFACE_P = np.array([SURFACE_SHARE[s] for s in SURFACES])
# Activity by hour of day (UTC): an evening peak, a night trough.
_HOURS = np.arange(24)
HOUR_P = 1.0 + 0.8 * np.cos((_HOURS - 20) / 24 * 2 * np.pi)
HOUR_P = HOUR_P / HOUR_P.sum()


def _cdf(p) -> np.ndarray:
    """The cumulative distribution numpy's Generator.choice(n, p=p) builds on every call."""
    cdf = np.asarray(p, dtype=float).cumsum()
    cdf /= cdf[-1]
    return cdf


def _draw(rng: np.random.Generator, cdf: np.ndarray, size=None):
    """What ``rng.choice(len(cdf), size, p=p)`` draws, from the same random numbers (so the world of a seed is
    unchanged), without the validation and cumulative sum that made choice most of the simulator's time."""
    return cdf.searchsorted(rng.random(size), side="right")


def _pick(rng: np.random.Generator, values: np.ndarray, size=None):
    """``rng.choice(values, size)`` (uniform, with replacement), from the same random numbers."""
    return values[rng.integers(0, len(values), size)]


HOUR_CDF, SURFACE_CDF, ACTION_CDF = _cdf(HOUR_P), _cdf(SURFACE_P), _cdf(ACTION_PROBS)


# The click logit's user-dependent terms (world.py), in the order of an impression's row of UserStream.effects
EFFECTS = ("long_term", "session", "long_range", "complement", "abandonment")


@dataclass
class UserStream:
    impressions: list[dict] = field(default_factory=list)
    clicks: list[dict] = field(default_factory=list)
    behaviors: list[dict] = field(default_factory=list)
    oracle: list[tuple] = field(default_factory=list)
    # per request, a row per impression: examination, the full-information logit, then each of EFFECTS' terms in
    # it (what the oracle's AUC loses without one effect: SimulationReport.effect_shares)
    effects: list[np.ndarray] = field(default_factory=list)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class _Column:
    """An append-only column of numbers held as one numpy array (grown by doubling). The brand and organic
    memories keep every event of a user's whole simulated span and are read on every ad request: converting
    them from Python lists each time grew with the days simulated. ``values`` holds what a list would have
    converted to, the same numbers in the same dtype."""

    def __init__(self, dtype) -> None:
        self._data = np.empty(64, dtype=dtype)
        self._n = 0

    def append(self, value) -> None:
        if self._n == len(self._data):
            self._data = np.concatenate([self._data, np.empty_like(self._data)])
        self._data[self._n] = value
        self._n += 1

    def __len__(self) -> int:
        return self._n

    @property
    def values(self) -> np.ndarray:
        return self._data[:self._n]


class _Memory:
    """Timestamped events a user has produced, for the session and long-range terms."""

    def __init__(self) -> None:
        self.recent_ts: list[int] = []
        self.recent_cat: list[int] = []
        self.brand_ts = _Column(np.int64)
        self.brand_id = _Column(np.int64)
        self.brand_w = _Column(np.float64)
        self.brand_act = _Column(np.int64)      # +1 a cart, -1 a buy, 0 a fav (the abandonment term)
        self.organic_ts = _Column(np.int64)     # every organic event, for the complement term
        self.organic_cat = _Column(np.int64)

    def add_interest(self, ts: int, category: int) -> None:
        self.recent_ts.append(ts)
        self.recent_cat.append(category)
        if len(self.recent_ts) > 256:
            cut = next(i for i, t in enumerate(self.recent_ts) if t > ts - SESSION_MEMORY_MS)
            del self.recent_ts[:cut], self.recent_cat[:cut]

    def add_brand(self, ts: int, brand: int, weight: float, act: int) -> None:
        self.brand_ts.append(ts)
        self.brand_id.append(brand)
        self.brand_w.append(weight)
        self.brand_act.append(act)

    def add_organic(self, ts: int, category: int) -> None:
        self.organic_ts.append(ts)
        self.organic_cat.append(category)

    def session_terms(self, now: int, categories: np.ndarray, decay_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """The session term with full information and at serving (nothing newer than SERVING_DELAY_MS)."""
        ts, cats = np.asarray(self.recent_ts), np.asarray(self.recent_cat)
        return tuple(self._session_term(now - ts, cats, categories, decay_ms, min_age)
                     for min_age in (1, SERVING_DELAY_MS))

    @staticmethod
    def _session_term(age, cats, categories, decay_ms, min_age_ms) -> np.ndarray:
        keep = (age >= min_age_ms) & (age <= SESSION_MEMORY_MS)
        if not keep.any():
            return np.zeros(len(categories))
        w = np.exp(-age[keep] / decay_ms)
        return (cats[keep][None, :] == categories[:, None]) @ w

    def brand_terms(self, now: int, brands: np.ndarray, half_life_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """The long-range brand term with full information and at serving."""
        if not len(self.brand_ts):
            return np.zeros(len(brands)), np.zeros(len(brands))
        age = now - self.brand_ts.values
        decayed = self.brand_w.values * np.power(0.5, age / half_life_ms)
        same = self.brand_id.values[None, :] == brands[:, None]
        return tuple(same @ np.where(age >= min_age, decayed, 0.0) for min_age in (1, SERVING_DELAY_MS))


    def complement_terms(self, now: int, categories: np.ndarray, complement: np.ndarray,
                         half_life_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """Decayed organic events whose category's complement is each ad's category, full and at serving."""
        if not len(self.organic_ts):
            return np.zeros(len(categories)), np.zeros(len(categories))
        age = now - self.organic_ts.values
        leads_to = complement[self.organic_cat.values][None, :] == categories[:, None]
        decayed = np.power(0.5, age / half_life_ms)
        return tuple(leads_to @ np.where(age >= min_age, decayed, 0.0) for min_age in (1, SERVING_DELAY_MS))

    def abandonment_terms(self, now: int, brands: np.ndarray, half_life_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """Per ad: the sign of its brand's newest cart (+1) or buy (-1), decayed by its age; full and at serving."""
        terms = (np.zeros(len(brands)), np.zeros(len(brands)))
        if not len(self.brand_ts):
            return terms
        age, act, brand = now - self.brand_ts.values, self.brand_act.values, self.brand_id.values
        for term, min_age in zip(terms, (1, SERVING_DELAY_MS)):
            seen = (age >= min_age) & (act != 0)
            for k, b in enumerate(brands):
                newest = np.flatnonzero(seen & (brand == b))
                if newest.size:
                    term[k] = act[newest[-1]] * 0.5 ** (age[newest[-1]] / half_life_ms)
        return terms


def simulate_user(cfg: WorldConfig, cat: Catalog, seed: int, user: int) -> UserStream:
    rng = np.random.default_rng([seed, 1, user])
    st = cfg.strengths
    n_cat = cfg.n_categories
    interest = rng.dirichlet(np.full(n_cat, cfg.interest_concentration))
    interest_cdf = _cdf(interest)
    log_interest = np.clip(np.log(n_cat * interest + 1e-3), -3.0, 2.0)
    sigma = cfg.activity_sigma
    rate = cfg.sessions_per_day * rng.lognormal(-sigma * sigma / 2, sigma)
    device = landing.DEVICES[int(rng.integers(len(landing.DEVICES)))]
    out = UserStream()
    mem = _Memory()
    decay_ms = st.session_decay_min * 60_000
    half_life_ms = st.long_range_half_life_days * DAY_MS
    pool_cdfs = {after: _cdf(cat.ad_pool(after)[0]) for after in (False, True)}
    request_no = 0
    last_item = -1
    for day in range(cfg.n_days):
        date = _date(cfg.start_date, day)
        day_start = landing.day_start_ms(date)
        after_shift = cfg.shift_day is not None and date >= cfg.shift_day
        day_end = day_start + DAY_MS
        n_sessions = int(rng.poisson(rate))
        hours = np.sort(_draw(rng, HOUR_CDF, n_sessions))
        next_free = day_start
        for h in hours:
            start = max(day_start + int(h) * HOUR_MS + int(rng.integers(HOUR_MS)), next_free)
            session_cat = int(_draw(rng, interest_cdf)) if rng.random() < 0.85 else int(rng.integers(n_cat))
            if after_shift and rng.random() < SHIFT.trend_share:  # drawn only after the shift: earlier days stay
                session_cat = int(_pick(rng, cat.shifted.trending))
            n_events = 1 + int(rng.poisson(cfg.events_per_session - 1))
            ts = start
            for _ in range(n_events):
                ts += 1_000 + int(rng.exponential(45_000))
                if ts >= day_end - 1_000:
                    break
                if rng.random() < cfg.ad_request_share:
                    request_no += 1
                    _ad_request(cfg, cat, rng, out, mem, user, device, request_no, ts, session_cat,
                                log_interest, decay_ms, half_life_ms, pool_cdfs[after_shift], after_shift)
                else:
                    last_item = _behavior(cat, rng, out, mem, user, ts, session_cat, interest_cdf, last_item,
                                          st.repeat)
            next_free = ts + 60_000
    return out


def _date(start: str, offset: int) -> str:
    import datetime as dt

    return (dt.date.fromisoformat(start) + dt.timedelta(days=offset)).isoformat()


def _ad_request(cfg, cat: Catalog, rng, out: UserStream, mem: _Memory, user: int, device: str,
                request_no: int, ts: int, session_cat: int, log_interest, decay_ms, half_life_ms,
                popularity_cdf: np.ndarray, after_shift: bool) -> None:
    st = cfg.strengths
    surface = SURFACES[int(_draw(rng, SURFACE_CDF))]
    slots = SURFACE_SLOTS[surface]
    pool = cat.ad_pool(after_shift)[1][session_cat]
    targeted = rng.random(slots) < cfg.targeting
    ads = _draw(rng, popularity_cdf, slots)
    if pool.size:
        ads = np.where(targeted, _pick(rng, pool, slots), ads)
    ad_cat = cat.ad_category[ads]
    ad_brand = cat.ad_brand[ads]
    base = cfg.bias_logit + cat.ad_quality[ads] + st.long_term * log_interest[ad_cat]
    # log1p saturates both memories: the tenth same-category view adds little over the third.
    (session, session_served), (brand, brand_served) = (mem.session_terms(ts, ad_cat, decay_ms),
                                                        mem.brand_terms(ts, ad_brand, half_life_ms))
    full = base + st.session * np.log1p(session) + st.long_range * np.log1p(brand)
    serving = base + st.session * np.log1p(session_served) + st.long_range * np.log1p(brand_served)
    terms = {"long_term": st.long_term * log_interest[ad_cat], "session": st.session * np.log1p(session),
             "long_range": st.long_range * np.log1p(brand)}
    # added only when on, so that a world without them is bit for bit what it was
    if st.complement:
        lift, lift_served = mem.complement_terms(ts, ad_cat, cat.complement, st.complement_half_life_hours * HOUR_MS)
        terms["complement"] = st.complement * np.log1p(lift)
        full, serving = full + terms["complement"], serving + st.complement * np.log1p(lift_served)
    if st.abandonment:
        sign, sign_served = mem.abandonment_terms(ts, ad_brand, st.abandonment_half_life_hours * HOUR_MS)
        terms["abandonment"] = st.abandonment * sign
        full, serving = full + terms["abandonment"], serving + st.abandonment * sign_served
    exam = cat.examination[surface][:slots]
    out.effects.append(np.column_stack([exam, full, *(terms.get(e, np.zeros(slots)) for e in EFFECTS)]))
    p_rel = _sigmoid(full)
    p_click = exam * p_rel
    p_serving = exam * _sigmoid(serving)
    clicked = rng.random(slots) < p_click
    request_id = f"q{user}-{request_no}"
    # Python numbers of the slots, read once (tolist gives what int()/float()/bool() of each element gives)
    ads_, cats_, brands_ = ads.tolist(), ad_cat.tolist(), ad_brand.tolist()
    campaigns, advertisers = cat.ad_campaign[ads].tolist(), cat.ad_advertiser[ads].tolist()
    p_clicks, p_servings, p_rels, clicks_ = p_click.tolist(), p_serving.tolist(), p_rel.tolist(), clicked.tolist()
    for k in range(slots):
        ad = ads_[k]
        impression_id = f"{request_id}-{k + 1}"
        out.impressions.append({
            "request_id": request_id, "impression_id": impression_id, "user_id": user, "ts_ms": ts,
            "ad_id": ad, "campaign_id": campaigns[k], "advertiser_id": advertisers[k],
            "category_id": cats_[k], "brand_id": brands_[k], "position": k + 1,
            "surface": surface, "device": device,
        })
        out.oracle.append((impression_id, request_id, user, ts, ad, surface, k + 1,
                           p_clicks[k], p_servings[k], p_rels[k], clicks_[k]))
        if clicks_[k]:
            click_ts = ts + 2_000 + min(int(rng.exponential(40_000)), 30 * 60_000 - 2_000)
            # Relevance drives the click type and dwell: relevant ads get carted and read longer.
            rel = p_rels[k]
            kind = int(_draw(rng, _cdf(_click_type_p(rel))))
            dwell = None if rng.random() < 0.1 else int(rng.lognormal(math.log(4_000) + 2.0 * rel, 0.6))
            out.clicks.append({
                "impression_id": impression_id, "request_id": request_id, "user_id": user, "ad_id": ad,
                "ts_ms": click_ts, "click_type": CLICK_TYPES[kind], "dwell_ms": dwell,
            })
            mem.add_interest(click_ts, cats_[k])


def _click_type_p(rel: float) -> np.ndarray:
    cart = 0.05 + 0.5 * rel
    follow = 0.08
    return np.array([1.0 - cart - follow, cart, follow])


def _behavior(cat: Catalog, rng, out: UserStream, mem: _Memory, user: int, ts: int, session_cat: int,
              interest_cdf: np.ndarray, last_item: int, repeat: float) -> int:
    if last_item >= 0 and rng.random() < repeat:
        item = last_item
    else:
        pool = cat.items_by_category[session_cat if rng.random() < 0.8 else int(_draw(rng, interest_cdf))]
        item = int(_pick(rng, pool)) if pool.size else int(rng.integers(len(cat.item_category)))
    action = ACTIONS[int(_draw(rng, ACTION_CDF))]
    category = int(cat.item_category[item])
    brand = int(cat.item_brand[item])
    out.behaviors.append({"user_id": user, "ts_ms": ts, "item_id": item, "category_id": category,
                          "brand_id": brand, "action": action})
    mem.add_interest(ts, category)
    mem.add_organic(ts, category)
    if action in MEMORY_WEIGHT:
        mem.add_brand(ts, brand, MEMORY_WEIGHT[action], BRAND_ACT.get(action, 0))
    return item
