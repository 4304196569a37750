"""A defect-laden landing world for the events job's regression test (``test_events_frozen.py``).

``make_defect_world`` lays the hand-made world of ``spark_corpus.make_world`` (3 days) and then adds,
to every day, a second file of each kind full of the cases a rewrite of the job is most likely to get
subtly wrong: exact copies across files, re-logged impressions with tied and earlier timestamps, two
in-window clicks at the same millisecond, repeated keys, integers that do not fit a bigint, empty ids,
nested values, non-object JSON, framing (BOM, CRLF, whitespace), clicks on the day before's
impressions, and copies of garbage (each copy is quarantined). Every line is deterministic.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import contracts
from tests.spark.spark_corpus import behavior, click, impression, make_world
from transforms import landing
from transforms.landing import FILE_KINDS, dumps


def _extra_lines(day: str, previous: str | None, first_lines: dict[str, list[str]]) -> dict[str, list[str]]:
    """The second file of each kind for ``day`` (``first_lines``: the lines of the first files)."""
    s = landing.day_start_ms(day)
    imps = [json.loads(x) for x in first_lines["impressions"] if x.startswith("{") and x.endswith("}")]
    ok = [i for i in imps if isinstance(i.get("ts_ms"), int) and isinstance(i.get("position"), int)
          and "surface" in i and "user_id" in i]
    a, b, c, d = ok[0], ok[1], ok[2], ok[3]
    fresh = [impression(day, 900 + k, s + 3_000_000 + 7 * k, user=k) for k in range(12)]
    imp_lines = [
        first_lines["impressions"][0],                            # exact copy of file 0's line 1
        dumps(dict(a, ts_ms=a["ts_ms"])) + " ",                   # same record, other text: a re-log (tie on ts)
        dumps(dict(b, ts_ms=b["ts_ms"] - 1)),                     # re-log with an earlier ts: this copy wins
        dumps(fresh[0]), dumps(fresh[0]), dumps(fresh[0]),        # three copies in one file
        dumps(dict(fresh[1], ts_ms=fresh[1]["ts_ms"] + 5)), dumps(fresh[1]),
        '{"request_id":"r","impression_id":"x-1"',                # truncated, twice: both quarantined
        '{"request_id":"r","impression_id":"x-1"',
        "null", '"a string"', "123", "[]", "{}", '{"a":1} trailing',
        dumps(fresh[2])[:-1] + ',"position":2}',                  # repeated key
        dumps(dict(fresh[3], ts_ms=10 ** 20)),                    # does not fit a bigint
        dumps(dict(fresh[4], ts_ms=-5)),
        dumps(dict(fresh[5], impression_id="   ")),
        dumps(dict(fresh[6], surface={"name": "feed"})),
        dumps(dict(fresh[7], surface="search", position=9)),
        dumps(dict(fresh[8], device="ios ")),
        dumps(dict(fresh[9], user_id=None)),
        "\ufeff" + dumps(dict(fresh[10], note={"nested": [1, 2]})) + "\r",   # BOM, CRLF, nested extra key
        "  \t" + json.dumps(fresh[11], ensure_ascii=False) + "  ",
        "",
        dumps(dict(c, position="3")),                             # numeric string position
        dumps(dict(d, ad_id=12.5, brand_id=True)),                # ids are opaque scalars
    ]
    click_lines = [
        dumps(click(fresh[0], fresh[0]["ts_ms"] + 10, "follow", 5)),
        dumps(click(fresh[0], fresh[0]["ts_ms"] + 10, "add_to_cart", 6)),   # same ms: file/line order wins
        dumps(click(fresh[0], fresh[0]["ts_ms"] + 10, "follow", 5)),        # exact copy of the first
        dumps(click(fresh[1], fresh[1]["ts_ms"] + 3_600_000, "follow", 1)),  # at the window's edge
        dumps(click(fresh[1], fresh[1]["ts_ms"] + 3_600_006, "follow", 1)),
        dumps(click(fresh[2], fresh[2]["ts_ms"] + 20, "follow", -1)),        # negative dwell
        dumps(click(fresh[2], fresh[2]["ts_ms"] + 20, "follow", None)),      # dwell absent
        dumps(dict(click(fresh[2], fresh[2]["ts_ms"] + 30, "follow"), dwell_ms=None)),
        dumps(dict(click(fresh[2], fresh[2]["ts_ms"] + 40, "follow"), dwell_ms=2.0)),
        dumps(click(fresh[5], fresh[5]["ts_ms"] + 40)),                     # its impression was quarantined
        dumps(click(b, b["ts_ms"] + 500, "view_details", 77)),              # on a re-logged impression
        '{"impression_id":', '{"impression_id":',
    ]
    if previous is not None:  # a click after midnight on one of the day before's impressions
        late_imp = impression(previous, 950, s - 120_000, user=3)
        click_lines.append(dumps(click(late_imp, s + 60_000, "follow", 9)))
        imp_lines.append(dumps(dict(late_imp, impression_id=f"i-{day}-950")))
    behavior_lines = [
        first_lines["behaviors"][-1],
        dumps(behavior(s + 10, 1, 2)), dumps(behavior(s + 10, 1, 2)),
        dumps(dict(behavior(s + 11, 1, 3), action="VIEW")),
        dumps(dict(behavior(s + 12, 1, 4), extra=1)),
        dumps(behavior(s - 1, 1, 5)), dumps(behavior(s + contracts.DAY_MS - 1, 1, 6)),
        dumps(dict(behavior(s + 13, 1, 7), item_id="")),
        "not json at all",
    ]
    return {"impressions": imp_lines, "clicks": click_lines, "behaviors": behavior_lines}


def make_defect_world(root: Path) -> list[str]:
    """Write the world under ``root``; returns its days (each with a complete ``_SUCCESS``)."""
    world = make_world(root, start="2026-05-01", n_days=3, n_imps=60, n_beh=30, seed=5)
    previous = None
    for day in world.days:
        path = landing.day_dir(root, day)
        first = {k: landing.read_lines(path / f"{k}-00000.jsonl.gz") for k in FILE_KINDS}
        success = json.loads((path / landing.SUCCESS_MARKER).read_text())
        for kind, lines in _extra_lines(day, previous, first).items():
            name = f"{kind}-00001.jsonl.gz"
            (path / name).write_bytes(gzip.compress("".join(x + "\n" for x in lines).encode(), mtime=0))
            success["files"][name] = len(lines)
        (path / landing.SUCCESS_MARKER).write_text(json.dumps(success, sort_keys=True))
        previous = day
    return world.days


def observed(results: dict) -> dict:
    """What a run of the job over the world produced, as JSON: per day the accounting, the per-file
    counts, the clicked impressions, and every row of the event table and of the quarantine (sorted)."""
    import pyarrow.parquet as pq

    def rows(path: str) -> list[list]:
        table = pq.read_table(path)
        return sorted((list(r.values()) for r in table.to_pylist()), key=lambda r: json.dumps(r))

    return {day: {"accounting": {k: vars(a) for k, a in r.accounting.items()}, "files": r.files,
                  "clicked_impressions": r.clicked_impressions,
                  "events": rows(r.events_path), "quarantine": rows(r.quarantine_path)}
            for day, r in results.items()}


FROZEN = Path(__file__).with_name("frozen_defect_world.json")


def main() -> None:
    """Freeze the current implementation's output (run once, before a change of the job's code)."""
    import tempfile

    from transforms.spark.events import run_events_job
    from transforms.spark.session import build_session

    spark = build_session(master="local[2]", driver_memory="1g", shuffle_partitions=2, app_name="genrank-freeze")
    with tempfile.TemporaryDirectory() as tmp:
        days = make_defect_world(Path(tmp))
        FROZEN.write_text(json.dumps(observed({d: run_events_job(spark, tmp, d) for d in days}), indent=0, sort_keys=True) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
