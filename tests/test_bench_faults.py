"""The fault-injection benchmark's short form (bench/faults.py): two server processes on a
PostgreSQL cluster and a Redis server of its own, each fault once, and the issue's "done when"
checked on what it counted. Minutes long: it runs only when selected, `pytest -m faults`."""

from __future__ import annotations

import argparse
import shutil

import pytest

from bench import faults

pytestmark = pytest.mark.faults


@pytest.fixture(autouse=True)
def _only_when_selected(request):
    if "faults" not in (request.config.getoption("-m") or ""):
        pytest.skip("the fault-injection run is selected with -m faults")
    if not (shutil.which("initdb") and shutil.which("redis-server")):
        pytest.skip("needs initdb and redis-server (a PostgreSQL and a Redis of its own)")


def test_no_fault_loses_a_send_or_leaves_anyone_waiting():
    args = argparse.Namespace(
        faults_processes=2,
        faults_users=3,
        faults_sessions=2,
        faults_seconds=12.0,
        faults_outage=6.0,
        faults_burst=40,
        faults_scenarios="none,kill9,redis,postgres,llm,burst",
    )
    faults.run(args=args, command="pytest -m faults")
    for r in args.faults_results:
        where = r["scenario"]
        assert r["attempted"] > 0, where
        for key in (
            "lost",
            "duplicated",
            "stuck",
            "streams_silent",
            "watch_missing_done",
            "watch_wrong_text",
            "refused",
            "rest_500",
        ):
            assert r[key] == 0, (where, key, r)
        if where == "kill9":
            assert r["kill9_new_send_s"] <= 10, r
