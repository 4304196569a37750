"""Every dbt data test of transforms/dbt fails on a row built to break it, and only on that row.

One small warehouse is built once (two days, ``max_seq_len`` 3 so that histories hit the cap), one row per
test is broken inside the window, and ``dbt test`` runs once over it through the project's dbt resource.
Each test must then report exactly one failing row: a ``where`` filter that emptied the window would
report none, and a break that leaked into another test would show up there as a second failure.
"""

from __future__ import annotations

import json

import duckdb
import pytest

from assets.sequences import dbt_resource
from tests.event_lake import day_range, write_lake

DAYS = day_range("2026-01-01", 2)
MAX_SEQ_LEN = 3
DAY = DAYS[-1]

# dbt test name -> the statement that breaks one row of the last day for it. Each break picks its own
# user (the n-th, by id, of the day's users with a full history and a target), so that no break reaches a
# second test. The fixture checks that each statement changed exactly one row.
SAMPLE_USER = (f"(select user_id from (select user_id, row_number() over (order by user_id) as n from training_samples "
               f"where sample_date = '{DAY}' group by user_id having count(*) filter (where is_target) > 0 and "
               f"count(*) filter (where event_date < sample_date) = {MAX_SEQ_LEN}) where n = {{n}})")
TARGET_ROW = (f"sample_date = '{DAY}' and user_id = {SAMPLE_USER} and event_rank = (select min(event_rank) "
              f"from training_samples where sample_date = '{DAY}' and is_target and user_id = {SAMPLE_USER})")
HISTORY_ROW = (f"sample_date = '{DAY}' and user_id = {SAMPLE_USER} and event_rank = (select {{which}}(event_rank) "
               f"from training_samples where sample_date = '{DAY}' and event_date < sample_date and user_id = {SAMPLE_USER})")
SEQUENCE_USER = (f"(select user_id from user_sequences where added_date = '{DAY}' group by user_id "
                 f"having count(*) >= 2 order by user_id limit 1 offset {{n}})")
FIRST_SEQUENCE_ROW = (f"added_date = '{DAY}' and user_id = {SEQUENCE_USER} and seq_index = (select min(seq_index) "
                      f"from user_sequences where added_date = '{DAY}' and user_id = {SEQUENCE_USER})")
BUCKET_ROW = (f"as_of_date = '{DAY}' and position = (select min(position) from position_buckets "
              f"where as_of_date = '{DAY}' and surface = '{{surface}}') and surface = '{{surface}}'")


BREAKS = {
    "not_null_position_ctr_as_of_date":
        f"insert into position_ctr select * replace (null as as_of_date) from position_ctr where as_of_date = '{DAY}' limit 1",
    "not_null_position_ctr_ctr":
        "update position_ctr set ctr = null where " + BUCKET_ROW.format(surface="feed").replace("position_buckets", "position_ctr"),
    "not_null_position_buckets_position_bucket":
        "update position_buckets set position_bucket = null where " + BUCKET_ROW.format(surface="feed"),
    "accepted_values_position_buckets_position_bucket__False___range_var_n_position_buckets_list_":
        "update position_buckets set position_bucket = 7 where " + BUCKET_ROW.format(surface="search"),
    "accepted_values_position_buckets_surface__feed__search__detail":
        "update position_buckets set surface = 'banner' where " + BUCKET_ROW.format(surface="detail"),
    "not_null_user_sequences_user_id":
        f"insert into user_sequences select * replace (null as user_id) from user_sequences where added_date = '{DAY}' limit 1",
    # the user's first event of the day is stamped after its second one
    "strictly_time_ordered_user_sequences_ts_ms__seq_index__user_id":
        f"update user_sequences set ts_ms = ts_ms + {24 * 3600 * 1000} where " + FIRST_SEQUENCE_ROW.format(n=0),
    "accepted_values_user_sequences_event_kind__impression__behavior":
        "update user_sequences set event_kind = 'click' where " + FIRST_SEQUENCE_ROW.format(n=1),
    # an impression logged twice: a copy at the end of the user's sequence (no time, so no order to break)
    "unique_user_sequences_impression_id":
        f"insert into user_sequences select * replace (seq_index + 100000 as seq_index, null as ts_ms) from user_sequences "
        f"where added_date = '{DAY}' and impression_id is not null order by user_id, seq_index limit 1",
    "not_null_training_samples_label": "update training_samples set label = null where " + TARGET_ROW.format(n=1),
    "accepted_values_training_samples_label__False__0__1":
        "update training_samples set label = 2 where " + TARGET_ROW.format(n=2),
    "not_null_training_samples_position_bucket":
        "update training_samples set position_bucket = null where " + TARGET_ROW.format(n=3),
    "not_null_training_samples_request_id":
        "update training_samples set request_id = null where " + TARGET_ROW.format(n=4),
    "relationships_training_samples_user_id__user_id__ref_user_stats_":
        "update training_samples set user_id = 'ghost' where " + HISTORY_ROW.format(n=5, which="max"),
    # one history event more than max_seq_len: the user's oldest kept one, once again
    "history_within_max_len_training_samples_event_rank":
        "insert into training_samples select * replace (event_rank - 1000 as event_rank) from training_samples where "
        + HISTORY_ROW.format(n=6, which="min"),
    # a history row (an earlier day's event) stamped at the day's first target: future leakage
    "no_history_at_or_after_target_training_samples_event_rank":
        f"update training_samples set ts_ms = (select min(ts_ms) from training_samples where sample_date = '{DAY}' "
        f"and is_target and user_id = {SAMPLE_USER.format(n=7)}) where " + HISTORY_ROW.format(n=7, which="max"),
    "not_null_training_samples_campaign_impressions_28d":
        "update training_samples set campaign_impressions_28d = null where " + TARGET_ROW.format(n=8),
    "not_null_item_stats_clicks":
        f"update item_stats set clicks = null where stat_date = '{DAY}' and (ad_id, campaign_id) = "
        f"(select (ad_id, campaign_id) from item_stats where stat_date = '{DAY}' order by all limit 1)",
    "not_null_item_windows_key":
        "insert into item_windows select * replace (null as key) from item_windows "
        f"where as_of_date = cast('{DAY}' as date) + 1 limit 1",   # the day after the window: what serving reads next
    "not_null_user_stats_sequence_length":
        f"update user_stats set sequence_length = null where stat_date = '{DAY}' and user_id = "
        f"(select min(user_id) from user_stats where stat_date = '{DAY}')",
}


def _dbt(args: list[str]) -> dict:
    """One dbt command through the pipeline's DbtCliResource; its run_results.json."""
    invocation = dbt_resource().cli(args, raise_on_error=False)
    list(invocation.stream_raw_events())
    return invocation.get_artifact("run_results.json")


def _vars() -> list[str]:
    return ["--vars", json.dumps({"start_date": DAYS[0], "end_date": DAYS[-1], "max_seq_len": MAX_SEQ_LEN})]


@pytest.fixture(scope="module")
def broken_results(tmp_path_factory):
    """{test name: (status, failures)} of `dbt test` over a warehouse with one broken row per test."""
    home = tmp_path_factory.mktemp("dbt_broken")
    write_lake(home, DAYS, n_users=40, mean_events=12)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GENRANK_HOME", str(home))    # the dbt profile and sources read it
        built = _dbt(["build", *_vars()])
        assert {r["status"] for r in built["results"]} <= {"success", "pass"}, built["results"]
        with duckdb.connect(str(home / "warehouse.duckdb")) as con:
            for name, statement in BREAKS.items():
                con.execute(statement)
                changed = con.fetchone()[0]
                assert changed == 1, f"{name}: the break changed {changed} rows, not one"
        tested = _dbt(["test", *_vars()])
    return {r["unique_id"].split(".")[2]: (r["status"], r["failures"]) for r in tested["results"]}


@pytest.mark.parametrize("test_name", sorted(BREAKS))
def test_the_dbt_test_fails_on_the_one_row_broken_for_it(broken_results, test_name):
    assert broken_results[test_name] == ("fail", 1)

