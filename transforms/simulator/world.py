"""The simulated ad world: users, ads, organic items and the true click model.

The world is the yardstick of the project: for every impression it knows the true click probability,
so the best achievable AUC is known. Each effect a sequence model should exploit is an explicit term
of the click logit with its own strength, so an ablation can switch it off:

    p_click = examination(surface, position) * sigmoid(bias + quality[ad]
              + long_term   * log(C * interest[user, category[ad]])     (sparse Dirichlet interests)
              + session     * sum_{recent events e of the same category} exp(-age_e / session_decay)
              + long_range  * sum_{cart/fav/buy e of the same brand} weight_e * 0.5^(age_e / half_life)
              + complement  * log(1 + sum_{organic e with complement[category_e] = category[ad]} 0.5^(age_e / h_c))
              + abandonment * sign(newest cart-or-buy e of brand[ad]) * 0.5^(age_e / h_a))
                                                          (sign: +1 for a cart, -1 for a buy, 0 for none)

The session term decays within minutes, so it "mostly acts within the hour": under serving
visibility (nothing newer than one hour) it nearly vanishes, which is why training with a delay mask
matters. The long-range term lives for weeks, so a long-history model beats a short-history one.
The last two (off unless their strength is set) are what per-key counters cannot carry: ``complement`` is a
derangement of the categories (each leads to one other), so the events that lift an ad are of another category
than the ad's; ``abandonment`` depends on the order of a brand's carts and buys, which window counts lose.
Examination per surface follows a position-bias curve whose first three slots have the shape of the
real left/center/right CTRs of the Open Bandit Dataset (random policy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

# CTR by slot (left, center, right) of the Open Bandit Dataset small sample, random logging policy,
# all three campaigns pooled: 38/9935, 51/10174, 41/9891 clicks/impressions (../shared/data/
# open_bandit_dataset_small; recomputed by tests/test_simulator.py::test_obd_position_shape).
OBD_SLOT_CTR = (38 / 9935, 51 / 10174, 41 / 9891)


@dataclass(frozen=True)
class Strengths:
    """Strength of each effect in the click logit (0 switches it off)."""

    long_term: float = 0.45       # weight of log(C * interest) for the ad's category
    session: float = 0.9          # weight per recent same-category event (decay below)
    session_decay_min: float = 15.0
    long_range: float = 1.2       # weight of decayed same-brand cart/fav/buy memory
    long_range_half_life_days: float = 21.0
    quality: float = 0.5          # std of per-ad quality in logit units
    position_bias: float = 1.0    # 0: flat examination, 1: the full curve
    repeat: float = 0.55          # probability that an organic event revisits the previous item
    # Effects that per-key counters cannot carry (issue #33), off in the additive worlds: a counter of the ad's own
    # category or brand holds neither which other category leads to it nor in which order the actions came.
    complement: float = 0.0       # weight of decayed organic events of the category whose complement is the ad's
    complement_half_life_hours: float = 24.0
    abandonment: float = 0.0      # + when the newest cart-or-buy of the ad's brand is a cart, - when it is a buy
    abandonment_half_life_hours: float = 48.0

    def __post_init__(self):
        """An out-of-range strength is an error naming it (`genrank simulate --strengths NAME=VALUE`)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_min", "_days", "_hours")) and not value > 0:
                raise ValueError(f"strength {f.name}={value!r}: a decay or half-life must be > 0")
            if f.name in ("position_bias", "repeat") and not 0 <= value <= 1:
                raise ValueError(f"strength {f.name}={value!r}: must be between 0 and 1")
            if f.name in ("quality", "complement", "abandonment") and not value >= 0:
                raise ValueError(f"strength {f.name}={value!r}: must be >= 0 (0 turns the effect off)")


@dataclass(frozen=True)
class DefectRates:
    """Per-line probabilities of each log defect (see transforms/simulator/defects.py)."""

    duplicate_line: float = 0.01
    duplicate_impression_id: float = 0.005
    malformed_json: float = 0.004
    missing_key: float = 0.003
    bad_type: float = 0.003
    out_of_order: float = 0.02
    late_logged_click: float = 0.03   # a click of day D written to D+1's file although it happened on D
    extra_field_from_day: int = 2     # index of the first day whose impressions carry an unknown field


@dataclass(frozen=True)
class WorldConfig:
    n_users: int = 300
    n_days: int = 8
    start_date: str = "2026-01-01"
    n_categories: int = 24
    n_brands: int = 120
    n_ads: int = 2_000
    n_advertisers: int = 150
    n_campaigns: int = 500
    n_items: int = 8_000
    interest_concentration: float = 0.15   # Dirichlet alpha per category: small = sparse interests
    sessions_per_day: float = 2.0           # mean over users; per-user rates are log-normal (long tail)
    activity_sigma: float = 1.1
    events_per_session: float = 9.0
    ad_request_share: float = 0.3           # share of session events that are ad requests
    targeting: float = 0.6                  # share of shown ads drawn from the session's category
    bias_logit: float = -4.6
    strengths: Strengths = field(default_factory=Strengths)
    defects: DefectRates = field(default_factory=DefectRates)
    shift_day: str | None = None            # from this day on the world drifts (WorldShift below); None: never


@dataclass(frozen=True)
class WorldShift:
    """What changes from ``WorldConfig.shift_day`` on (``genrank simulate --shift-day D``): a few categories
    become a trend that takes a share of every user's sessions, and every ad shown comes from a new pool
    of ads (new ids, qualities and popularities) that no earlier day showed."""

    trending_categories: int = 3
    trend_share: float = 0.5   # probability that a session from the shift day on is about a trending category


SHIFT = WorldShift()


PRESETS: dict[str, WorldConfig] = {
    "tiny": WorldConfig(n_users=40, n_days=4, n_ads=300, n_items=800, n_campaigns=80, n_advertisers=30, n_brands=40),
    "demo": WorldConfig(n_users=300, n_days=8),
    # the demo's sizes with the two effects counters cannot carry (issue #33), each at a strength that takes about
    # as much of the oracle's AUC as an additive effect does (seed 0: complement 0.024, abandonment 0.014, against
    # 0.010-0.015 for long_term, session and long_range), so that neither decides the world alone
    "sequence": WorldConfig(n_users=300, n_days=8, strengths=Strengths(complement=1.0, abandonment=2.0)),
    "large": WorldConfig(n_users=7_000, n_days=21, n_ads=20_000, n_items=60_000, n_campaigns=4_000,
                         n_advertisers=1_000, n_brands=600, sessions_per_day=2.2),
}

SURFACE_SLOTS = {"feed": 5, "search": 8, "detail": 3}
SURFACE_SHARE = {"feed": 0.6, "search": 0.25, "detail": 0.15}
SURFACE_SCALE = {"feed": 1.0, "search": 0.9, "detail": 0.7}
TAIL_DECAY = 0.72  # examination ratio between consecutive slots after the third


def examination_table(strength: float) -> dict[str, np.ndarray]:
    """Examination probability per surface and 1-based slot (index 0 = slot 1)."""
    head = np.array(OBD_SLOT_CTR) / max(OBD_SLOT_CTR)
    table = {}
    for surface, slots in SURFACE_SLOTS.items():
        curve = np.empty(slots)
        curve[: min(3, slots)] = head[: min(3, slots)]
        for k in range(3, slots):
            curve[k] = curve[k - 1] * TAIL_DECAY
        curve = SURFACE_SCALE[surface] * curve
        table[surface] = 1.0 - strength * (1.0 - curve)
    return table


def complement_map(n_categories: int, seed: int) -> np.ndarray:
    """Each category's complement: a cycle through the categories in a random order, so none is its own. Its
    own random stream: the catalog's other draws are the same with and without it."""
    order = np.random.default_rng([seed, 0xC0C]).permutation(n_categories)
    complement = np.empty(n_categories, np.int64)
    complement[order] = np.roll(order, -1)
    return complement


@dataclass
class Catalog:
    """Everything about ads and organic items that does not depend on a user."""

    ad_category: np.ndarray
    ad_brand: np.ndarray
    ad_campaign: np.ndarray
    ad_advertiser: np.ndarray
    ad_quality: np.ndarray
    ad_popularity: np.ndarray
    ads_by_category: list[np.ndarray]  # the ads shown before the shift (all of them without one)
    item_category: np.ndarray
    item_brand: np.ndarray
    items_by_category: list[np.ndarray]
    examination: dict[str, np.ndarray]
    complement: np.ndarray                  # category -> the one other category its events lift (Strengths)
    shifted: "ShiftedWorld | None" = None   # the ad pool and category trend from cfg.shift_day on

    def ad_pool(self, after_shift: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        """(popularity over every ad id, ads of each category) that a request draws from."""
        if after_shift and self.shifted is not None:
            return self.shifted.ad_popularity, self.shifted.ads_by_category
        return self.ad_popularity, self.ads_by_category

    @classmethod
    def build(cls, cfg: WorldConfig, seed: int) -> "Catalog":
        rng = np.random.default_rng([seed, 0xCA7])
        c = cfg.n_categories
        campaign_advertiser = rng.integers(0, cfg.n_advertisers, cfg.n_campaigns)
        ad_campaign = rng.integers(0, cfg.n_campaigns, cfg.n_ads)
        ad_category = rng.integers(0, c, cfg.n_ads)
        # Brands belong to categories, so "related" (same brand) ads share a category too.
        brand_category = rng.integers(0, c, cfg.n_brands)
        brands_by_category = [np.flatnonzero(brand_category == k) for k in range(c)]
        for k in range(c):
            if brands_by_category[k].size == 0:
                brands_by_category[k] = np.array([k % cfg.n_brands])
        ad_brand = np.array([rng.choice(brands_by_category[k]) for k in ad_category])
        item_category = rng.integers(0, c, cfg.n_items)
        item_brand = np.array([rng.choice(brands_by_category[k]) for k in item_category])
        popularity = rng.zipf(1.6, cfg.n_ads).astype(float)
        catalog = cls(
            ad_category=ad_category,
            ad_brand=ad_brand,
            ad_campaign=ad_campaign,
            ad_advertiser=campaign_advertiser[ad_campaign],
            ad_quality=rng.normal(0.0, cfg.strengths.quality, cfg.n_ads),
            ad_popularity=popularity / popularity.sum(),
            ads_by_category=[np.flatnonzero(ad_category == k) for k in range(c)],
            item_category=item_category,
            item_brand=item_brand,
            items_by_category=[np.flatnonzero(item_category == k) for k in range(c)],
            examination=examination_table(cfg.strengths.position_bias),
            complement=complement_map(c, seed),
        )
        return catalog if cfg.shift_day is None else catalog.with_shift(cfg, seed)

    def with_shift(self, cfg: WorldConfig, seed: int) -> "Catalog":
        """The catalog with a second pool of ``n_ads`` ads (ids n_ads..2 n_ads-1) for the days from the shift
        on, drawn from their own random stream so that the days before the shift are the unshifted world's."""
        rng = np.random.default_rng([seed, 0x5F7])
        n, c = cfg.n_ads, cfg.n_categories
        category = rng.integers(0, c, n)
        # a new ad's brand and campaign are an old ad's of its category: brands belong to categories
        donors = np.array([rng.choice(self.ads_by_category[k]) if self.ads_by_category[k].size else rng.integers(n)
                           for k in category])
        popularity = rng.zipf(1.6, n).astype(float)
        shifted = ShiftedWorld(
            ad_popularity=np.r_[np.zeros(n), popularity / popularity.sum()],
            ads_by_category=[np.flatnonzero(category == k) + n for k in range(c)],
            trending=rng.choice(c, size=SHIFT.trending_categories, replace=False))
        return dataclasses.replace(
            self, ad_category=np.r_[self.ad_category, category], ad_brand=np.r_[self.ad_brand, self.ad_brand[donors]],
            ad_campaign=np.r_[self.ad_campaign, self.ad_campaign[donors]],
            ad_advertiser=np.r_[self.ad_advertiser, self.ad_advertiser[donors]],
            ad_quality=np.r_[self.ad_quality, rng.normal(0.0, cfg.strengths.quality, n)],
            shifted=shifted)


@dataclass
class ShiftedWorld:
    ad_popularity: np.ndarray          # over every ad id: zero on the old pool
    ads_by_category: list[np.ndarray]  # the new pool's ads of each category
    trending: np.ndarray               # the categories that trend
