"""The real-data importers: each dataset in ../shared/data lands in the simulator's landing format.

Each importer runs on a slice of its real dataset (the two small ones in full); line counts are
checked against counts taken independently from the source files, every landed line against the
landing contract, and the output for determinism. Bad input (unknown name, missing directory or
file, corrupt file) must raise SourceDataError naming the value or file.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import contracts
from transforms import landing
from transforms.importers import DATASET_DIRS, IMPORTERS, SourceDataError, import_dataset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

pytestmark = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"real datasets not found: {DATA} is absent (it lives beside the checkout)"
)

ML, MIND, EB, OBD = (DATA / DATASET_DIRS[n] for n in ("movielens", "mind", "ebnerd", "obd"))


# ----------------------------------------------------------------------------------------------
# helpers


def read_landing(out: Path) -> dict[str, dict[str, list[dict]]]:
    """Every landed day (checked with landing.open_day) -> kind -> parsed, contract-checked records."""
    days = landing.complete_days(out)
    dirs = sorted(p.name for p in (out / "landing").iterdir())
    assert dirs == [f"date={d}" for d in days], "every day directory must carry _SUCCESS (no temp dirs left)"
    result: dict[str, dict[str, list[dict]]] = {}
    for day in days:
        ld = landing.open_day(out, day, verify=True)  # _SUCCESS counts match the gzip members
        start = landing.day_start_ms(day)
        result[day] = {}
        for kind in landing.FILE_KINDS:
            records = []
            for path in ld.files[kind]:
                for raw in landing.read_lines(path):
                    rec = json.loads(raw)
                    check_record(kind, rec, start)
                    records.append(rec)
            assert [r["ts_ms"] for r in records] == sorted(r["ts_ms"] for r in records), f"{day} {kind} not time-ordered"
            result[day][kind] = records
    return result


def check_record(kind: str, rec: dict, day_start: int) -> None:
    assert isinstance(rec, dict)
    missing = [k for k in landing.REQUIRED_KEYS[kind] if k not in rec]
    assert not missing, f"{kind} line lacks {missing}: {rec}"
    extra = set(rec) - set(landing.REQUIRED_KEYS[kind]) - set(landing.OPTIONAL_KEYS[kind])
    assert not extra, f"{kind} line has unknown keys {extra}"
    for key in landing.INTEGER_KEYS[kind]:
        if key in rec and not (key == "dwell_ms" and rec[key] is None):
            assert type(rec[key]) is int, f"{kind}.{key} must be a JSON integer: {rec}"
    assert day_start <= rec["ts_ms"] < day_start + contracts.DAY_MS, f"{kind} line outside its day: {rec}"
    for key in ("user_id", "request_id", "impression_id", "ad_id", "campaign_id", "advertiser_id",
                "category_id", "brand_id", "item_id"):
        if key in rec:
            assert isinstance(rec[key], str) and rec[key], f"{kind}.{key} must be a non-empty string id: {rec}"
    if kind == "impressions":
        assert rec["position"] >= 1
        assert rec["surface"] in landing.SURFACES and rec["device"] in landing.DEVICES
    elif kind == "clicks":
        assert rec["click_type"] in contracts.CLICK_TYPES
        assert rec.get("dwell_ms") is None or rec["dwell_ms"] >= 0
    else:
        assert rec["action"] in contracts.ACTIONS


def flatten(days: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {k: [] for k in landing.FILE_KINDS}
    for kinds in days.values():
        for kind, recs in kinds.items():
            out[kind].extend(recs)
    return out


def check_consistency(report, days: dict) -> dict[str, list[dict]]:
    """Report == files; ids unique; every click joins its impression (same user, ad, day, later ts)."""
    assert report.reconciled, report.summary()
    assert all(c.ok for c in report.checks)
    assert report.days == sorted(days)
    flat = flatten(days)
    assert report.landed_lines == {k: len(v) for k, v in flat.items()}
    assert report.landed_lines_by_day == {d: {k: len(v) for k, v in kinds.items()} for d, kinds in days.items()}
    imps = {r["impression_id"]: r for r in flat["impressions"]}
    assert len(imps) == len(flat["impressions"]), "impression_id must be unique"
    assert len({r["impression_id"] for r in flat["clicks"]}) == len(flat["clicks"]), "one click per impression"
    for c in flat["clicks"]:
        i = imps[c["impression_id"]]
        assert (c["request_id"], c["user_id"], c["ad_id"]) == (i["request_id"], i["user_id"], i["ad_id"])
        assert i["ts_ms"] <= c["ts_ms"] <= i["ts_ms"] + 1000
        assert landing.day_of_ms(c["ts_ms"]) == landing.day_of_ms(i["ts_ms"])
    text = report.summary()
    assert "reconciled: yes" in text and report.dataset in text
    return flat


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------
# the importers on real data


def test_registry_names():
    assert set(IMPORTERS) == {"movielens", "mind", "ebnerd", "obd"} == set(DATASET_DIRS)


def test_movielens_slice(tmp_path):
    n_users = 12
    rows = list(csv.DictReader(open(ML / "ratings.csv", newline="")))
    users = sorted({int(r["userId"]) for r in rows})[:n_users]
    mine = [r for r in rows if int(r["userId"]) in users]
    genres = {r["movieId"]: r["genres"] for r in csv.DictReader(open(ML / "movies.csv", newline=""))}

    report = import_dataset("movielens", ML, tmp_path, limit_users=n_users)
    flat = check_consistency(report, read_landing(tmp_path))

    assert report.source_rows["ratings.csv"] == len(rows) == 100_836
    assert len(flat["impressions"]) == len(mine)
    assert len(flat["clicks"]) == sum(1 for r in mine if float(r["rating"]) >= 4.0)
    assert flat["behaviors"] == []
    assert report.dropped == {
        "ratings.csv: user not in --limit-users slice": len(rows) - len(mine),
        "ratings.csv [rating >= 4]: user not in --limit-users slice":
            sum(1 for r in rows if float(r["rating"]) >= 4.0) - len(flat["clicks"]),
    }
    assert report.days == sorted({dt.datetime.fromtimestamp(int(r["timestamp"]), dt.timezone.utc).date().isoformat()
                                  for r in mine})
    # field mapping of one known rating: user 1 rated movie 1 (Toy Story) 4.0 at 964982703
    imp = next(r for r in flat["impressions"] if r["impression_id"] == "ml-i1-1")
    assert imp["ts_ms"] == 964_982_703_000 and imp["user_id"] == "1" and imp["ad_id"] == "1"
    assert imp["category_id"] == "Adventure" and imp["brand_id"] == genres["1"]
    assert (imp["position"], imp["surface"], imp["device"]) == (1, "feed", "web")
    click = next(c for c in flat["clicks"] if c["impression_id"] == "ml-i1-1")
    assert click["ts_ms"] == imp["ts_ms"] + 1000 and click["dwell_ms"] is None


def test_movielens_time_slice_counts_drops(tmp_path):
    report = import_dataset("movielens", ML, tmp_path, limit_users=30, since="2000-08-01", until="2000-08-31",
                            fill_gaps=True)
    days = read_landing(tmp_path)
    check_consistency(report, days)
    assert report.days == [f"2000-08-{d:02d}" for d in range(1, 32)]  # contiguous, empty days included
    assert report.dropped["ratings.csv: outside --since/--until"] > 0
    kept = report.landed_lines["impressions"]
    assert kept + sum(n for k, n in report.dropped.items() if k.startswith("ratings.csv: ")) == 100_836
    assert any(v["impressions"] == 0 for v in report.landed_lines_by_day.values())


def test_mind_slice(tmp_path):
    n_users = 150
    rows = [line.rstrip("\n").split("\t") for line in open(MIND / "behaviors.tsv", encoding="utf-8")]
    users = set(sorted({r[1] for r in rows})[:n_users])
    mine = [r for r in rows if r[1] in users]
    pairs = [p for r in mine for p in r[4].split()]
    first_hist = {}
    for r in sorted(mine, key=lambda r: dt.datetime.strptime(r[2], "%m/%d/%Y %I:%M:%S %p")):
        first_hist.setdefault(r[1], r[3].split())

    report = import_dataset("mind", MIND, tmp_path, limit_users=n_users)
    days = read_landing(tmp_path)
    flat = check_consistency(report, days)

    assert report.source_rows["behaviors.tsv"] == 5000 and report.source_rows["behaviors.tsv [exposures]"] == 189_359
    assert len(flat["impressions"]) == len(pairs)
    assert len(flat["clicks"]) == sum(p.endswith("-1") for p in pairs)
    assert len(flat["behaviors"]) == sum(len(h) for h in first_hist.values())
    assert {r["position"] for r in flat["impressions"]} == {1}
    # history: in source order, 1 minute apart, all before 2019-11-09 00:00 UTC (the first impression day)
    window_start = landing.day_start_ms("2019-11-09")
    for user, hist in first_hist.items():
        mine_b = sorted((r for r in flat["behaviors"] if r["user_id"] == user), key=lambda r: r["ts_ms"])
        assert [r["item_id"] for r in mine_b] == hist
        assert [r["ts_ms"] for r in mine_b] == [window_start - (len(hist) - k) * 60_000 for k in range(len(hist))]
    assert min(r["ts_ms"] for r in flat["impressions"]) >= window_start
    # category from news.tsv where known
    news = {line.split("\t")[0]: line.split("\t")[1] for line in open(MIND / "news.tsv", encoding="utf-8")}
    for r in flat["impressions"]:
        assert r["category_id"] == news.get(r["ad_id"], "unknown")


def test_mind_without_history_counts_the_items(tmp_path):
    report = import_dataset("mind", MIND, tmp_path, limit_users=40, history=False)
    flat = check_consistency(report, read_landing(tmp_path))
    assert flat["behaviors"] == []
    assert report.dropped["behaviors.tsv [history items, earliest row per user]: history not landed (history=False)"] > 0


def test_ebnerd_full_parquet_and_tsv_agree(tmp_path):
    pytest.importorskip("pyarrow")
    a, b = tmp_path / "parquet", tmp_path / "tsv"
    report = import_dataset("ebnerd", EB, a, fmt="parquet")
    days = read_landing(a)
    flat = check_consistency(report, days)
    # the fixture's documented counts (SOURCE.md)
    assert report.source_rows["behaviors.parquet"] == 1046 and report.source_rows["history.parquet"] == 44
    assert report.landed_lines == {"impressions": 10_848, "clicks": 1_047, "behaviors": 8_303}
    assert report.dropped == {}
    assert {r["surface"] for r in flat["impressions"]} == {"feed", "detail"}
    assert any(c["dwell_ms"] is not None for c in flat["clicks"])
    # every user's history reads come before their impressions (history is the 21 days before)
    first_imp = {}
    for r in flat["impressions"]:
        first_imp[r["user_id"]] = min(first_imp.get(r["user_id"], r["ts_ms"]), r["ts_ms"])
    assert all(b_["ts_ms"] < first_imp.get(b_["user_id"], 1 << 62) for b_ in flat["behaviors"])

    report_tsv = import_dataset("ebnerd", EB, b, fmt="tsv")
    assert report_tsv.reconciled and report_tsv.landed_lines == report.landed_lines
    assert tree_bytes(a / "landing") == tree_bytes(b / "landing"), "parquet and tsv must land the same bytes"


def test_ebnerd_slice(tmp_path):
    report = import_dataset("ebnerd", EB, tmp_path, limit_users=5, fmt="tsv")
    flat = check_consistency(report, read_landing(tmp_path))
    assert len({r["user_id"] for r in flat["impressions"] + flat["behaviors"]}) <= 5
    assert report.landed_lines["impressions"] + report.dropped["behaviors.tsv [article_ids_inview]: user not in --limit-users slice"] == 10_848


def test_obd_full_random_policy(tmp_path):
    report = import_dataset("obd", OBD, tmp_path)
    flat = check_consistency(report, read_landing(tmp_path))
    src_rows = src_clicks = 0
    positions = Counter()
    for campaign in ("all", "men", "women"):
        for r in csv.DictReader(open(OBD / "random" / campaign / f"{campaign}.csv", newline="")):
            src_rows += 1
            src_clicks += r["click"] == "1"
            positions[int(r["position"])] += 1
    assert len(flat["impressions"]) == src_rows == 30_000
    assert len(flat["clicks"]) == src_clicks == 130
    assert Counter(r["position"] for r in flat["impressions"]) == positions
    assert set(positions) == {1, 2, 3}
    assert report.days == [f"2019-11-{d}" for d in range(24, 31)]
    assert all(r["user_id"].startswith("obd-u") for r in flat["impressions"])
    assert {r["campaign_id"] for r in flat["impressions"]} == {"all", "men", "women"}


def test_obd_bts_slice(tmp_path):
    report = import_dataset("obd", OBD, tmp_path, limit_users=10, policy="bts", campaigns="men")
    flat = check_consistency(report, read_landing(tmp_path))
    assert len({r["user_id"] for r in flat["impressions"]}) == 10
    assert all(r["impression_id"].startswith("obd-ibts-men-") for r in flat["impressions"])
    assert report.source_rows["bts/men/men.csv"] == 10_000


@pytest.mark.parametrize("name,limit,opts", [
    ("movielens", 8, {}),
    ("mind", 60, {}),
    ("ebnerd", 6, {}),
    ("obd", 15, {}),
])
def test_deterministic_bytes(tmp_path, name, limit, opts):
    src = DATA / DATASET_DIRS[name]
    r1 = import_dataset(name, src, tmp_path / "a", limit_users=limit, **opts)
    r2 = import_dataset(name, src, tmp_path / "b", limit_users=limit, **opts)
    # a re-run into the same root replaces each day exactly (idempotent)
    r3 = import_dataset(name, src, tmp_path / "a", limit_users=limit, **opts)
    assert r1.reconciled and r2.reconciled and r3.reconciled
    a, b = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    assert a and a == b
    assert r1.landed_lines == r2.landed_lines == r3.landed_lines


# ----------------------------------------------------------------------------------------------
# bad input


def test_unknown_dataset_name(tmp_path):
    with pytest.raises(SourceDataError, match="unknown dataset 'netflix'.*movielens"):
        import_dataset("netflix", ML, tmp_path)


@pytest.mark.parametrize("name", sorted(IMPORTERS))
def test_missing_source_directory(tmp_path, name):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(SourceDataError, match="does not exist") as exc:
        import_dataset(name, missing, tmp_path / "out")
    assert str(missing) in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_missing_file(tmp_path):
    src = tmp_path / "mind"
    src.mkdir()
    shutil.copy(MIND / "behaviors.tsv", src / "behaviors.tsv")
    with pytest.raises(SourceDataError, match="news.tsv is missing"):
        import_dataset("mind", src, tmp_path / "out")
    with pytest.raises(SourceDataError, match="all.csv is missing"):
        import_dataset("obd", tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_file_hints_at_nested_folder(tmp_path):
    with pytest.raises(SourceDataError, match=r"ratings.csv is missing \(found .*movielens_latest_small/ratings.csv"):
        import_dataset("movielens", DATA, tmp_path / "out")


def test_truncated_csv(tmp_path):
    src = tmp_path / "ml"
    src.mkdir()
    shutil.copy(ML / "movies.csv", src / "movies.csv")
    lines = (ML / "ratings.csv").read_text().splitlines(keepends=True)
    (src / "ratings.csv").write_text("".join(lines[:1001]) + lines[1001][:4])  # cut inside line 1002
    with pytest.raises(SourceDataError, match=r"ratings.csv line 1002: expected 4 fields, got \d") as exc:
        import_dataset("movielens", src, tmp_path / "out")
    assert str(src / "ratings.csv") in str(exc.value)
    assert not (tmp_path / "out").exists(), "nothing lands when the source is corrupt"


def test_bad_values_name_file_and_line(tmp_path):
    src = tmp_path / "ml"
    src.mkdir()
    shutil.copy(ML / "movies.csv", src / "movies.csv")
    (src / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,four,964981247\n")
    with pytest.raises(SourceDataError, match=r"ratings.csv line 3: column 'rating' is not a number: 'four'"):
        import_dataset("movielens", src, tmp_path / "out")
    (src / "ratings.csv").write_text("userId,movieId,score,timestamp\n1,1,4.0,964982703\n")
    with pytest.raises(SourceDataError, match=r"ratings.csv: header lacks column\(s\) \['rating'\]"):
        import_dataset("movielens", src, tmp_path / "out")
    (src / "ratings.csv").write_text("")
    with pytest.raises(SourceDataError, match=r"ratings.csv: empty file"):
        import_dataset("movielens", src, tmp_path / "out")

    msrc = tmp_path / "mind"
    msrc.mkdir()
    shutil.copy(MIND / "news.tsv", msrc / "news.tsv")
    good = (MIND / "behaviors.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:3]
    f = good[2].rstrip("\n").split("\t")
    f[4] = f[4].replace("-0", "-x", 1)
    (msrc / "behaviors.tsv").write_text("".join(good[:2]) + "\t".join(f) + "\n", encoding="utf-8")
    with pytest.raises(SourceDataError, match=r"behaviors.tsv line 3: impressions entry '.*-x' is not"):
        import_dataset("mind", msrc, tmp_path / "out")

    osrc = tmp_path / "obd"
    shutil.copytree(OBD / "random" / "men", osrc / "random" / "men")
    log = osrc / "random" / "men" / "men.csv"
    lines = log.read_text().splitlines(keepends=True)
    parts = lines[5].split(",")
    parts[3] = "0"  # position
    log.write_text("".join(lines[:5]) + ",".join(parts))
    with pytest.raises(SourceDataError, match=r"men.csv line 6: position 0 is not a 1-based slot"):
        import_dataset("obd", osrc, tmp_path / "out", campaigns=["men"])
    assert not (tmp_path / "out").exists()


def test_truncated_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    src = tmp_path / "eb"
    src.mkdir()
    shutil.copy(EB / "history.parquet", src / "history.parquet")
    data = (EB / "behaviors.parquet").read_bytes()
    (src / "behaviors.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceDataError, match="behaviors.parquet: corrupt or unreadable parquet") as exc:
        import_dataset("ebnerd", src, tmp_path / "out")
    assert str(src / "behaviors.parquet") in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_bad_options(tmp_path):
    with pytest.raises(SourceDataError, match="limit_users=0"):
        import_dataset("movielens", ML, tmp_path, limit_users=0)
    with pytest.raises(SourceDataError, match="--since 2001-01-01 is after --until 2000-01-01"):
        import_dataset("movielens", ML, tmp_path, since="2001-01-01", until="2000-01-01")
    with pytest.raises(SourceDataError, match="--since '2001/01/01': not an ISO date"):
        import_dataset("mind", MIND, tmp_path, since="2001/01/01")
    with pytest.raises(SourceDataError, match="policy 'greedy'"):
        import_dataset("obd", OBD, tmp_path, policy="greedy")
    with pytest.raises(SourceDataError, match="fmt='csv'"):
        import_dataset("ebnerd", EB, tmp_path, fmt="csv")
