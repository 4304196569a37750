"""The events job on a defect-laden world gives exactly the event table, quarantine and accounting that
the implementation before the speed work of issue 35 gave (frozen in ``frozen_defect_world.json`` by
``python -m tests.spark.defect_corpus`` at that commit): a faster job must not change bad-input behaviour."""

from __future__ import annotations

import json

import pytest

from tests.spark.defect_corpus import FROZEN, make_defect_world, observed
from transforms.spark.events import run_events_job

pytestmark = pytest.mark.spark


def test_defect_laden_days_give_the_frozen_event_table_quarantine_and_accounting(spark, tmp_path):
    days = make_defect_world(tmp_path)
    got = json.loads(json.dumps(observed({d: run_events_job(spark, tmp_path, d) for d in days}), sort_keys=True))
    want = json.loads(FROZEN.read_text())
    assert sorted(got) == sorted(want) == days
    for day in days:
        for part in ("accounting", "files", "clicked_impressions", "quarantine", "events"):
            assert got[day][part] == want[day][part], (day, part)
