"""The search benchmark's own logic (bench/search*.py), on tiny sizes and without timings: the
data recipe plants what it says, the search finds it, the report compares like with like."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from bench import search as search_bench
from bench import search_data as recipe
from bench.search_worker import _cell_counts, _plant, _walk
from chat.management.commands.seed_demo import seed_session
from chat.models import ChatMessage, ChatSession
from chat.search import selectors
from tests.factories import UserFactory


def test_layout_has_the_baseline_an_early_copy_and_the_rest() -> None:
    users = recipe.parse_layout("1000, 1000000, 100x10000")
    assert [(u.label, u.sessions, u.size) for u in users] == [
        ("1000", 1, 1000),
        ("1000-early", 1, 1000),
        ("1000000", 1, 1_000_000),
        ("100x10000", 100, 10_000),
    ]
    assert users[3].total == 1_000_000 and users[3].username == "search-100x10000"
    # The early copy first (the oldest ids), the large users in alternating turns, the
    # baseline last (the newest).
    plan = recipe.seeding_plan(users)
    assert (plan[0].user.label, plan[-1].user.label) == ("1000-early", "1000")
    middle = plan[1:-1]
    assert [s.user.label for s in middle[:11]] == ["1000000"] + ["100x10000"] * 10
    assert [s.session for s in middle[1:11]] == list(range(10))
    assert sum(s.messages for s in middle if s.user.label == "1000000") == 1_000_000
    assert {s.seed_offset for s in middle if s.user.label == "1000000"} == set(range(10))
    assert sorted(s.session for s in middle if s.user.label == "100x10000") == list(range(100))
    # Fewer sessions than turns, and a size that does not divide: still everything, once.
    odd = recipe.seeding_plan(recipe.parse_layout("50,3x60,1003"))
    assert sorted(s.session for s in odd if s.user.label == "3x60") == [0, 1, 2]
    assert sum(s.messages for s in odd if s.user.label == "1003") == 1003
    for bad in ("", "2x1000,5000", "1000,1000", "10"):
        with pytest.raises(ValueError):
            recipe.parse_layout(bad)


@pytest.mark.parametrize("total", [60, 1000, 10_000, 2_000_000])
def test_recipe_plants_each_rare_text_three_times_apart_from_the_chinese(total: int) -> None:
    rare = recipe.rare_positions(total)
    assert len(rare) == 6 and all(0 <= p < total for p in rare)
    assert all(p % recipe.CHINESE_EVERY not in (7, 32) for p in rare)
    assert recipe.expected_hits(total, "ident") == 3
    assert recipe.expected_hits(total, "zh-rare") == 3
    assert recipe.expected_hits(total, "zh") == len(range(7, total, 50))
    assert recipe.expected_hits(total, "common") is None
    texts = [recipe.planted_content(p, rare) for p in range(min(total, 5000))]
    # The other Chinese text never holds the word; nothing planted holds the wrong rare text.
    assert all(recipe.CHINESE_WORD not in t for t in recipe._OTHER)
    assert all(recipe.RARE_CHINESE_WORD not in (t or "") for t in texts if t not in rare.values())
    assert sum(1 for t in texts if t and recipe.CHINESE_WORD in t) == len(range(7, len(texts), 50))


@pytest.mark.django_db
@pytest.mark.parametrize("window", [selectors.WINDOW_ROWS, 40])
def test_planted_data_is_what_the_search_and_the_plain_scan_find(monkeypatch, window) -> None:
    # A 40-row window: the index answers below it, as it does for the large sessions.
    monkeypatch.setattr(selectors, "WINDOW_ROWS", window)
    monkeypatch.setattr(selectors, "SHORT_QUERY_WINDOW_ROWS", 100)
    spec = recipe.parse_layout("50,2x150")[2]
    user: Any = UserFactory(username=spec.username)  # the factory's call is typed as itself
    other: Any = UserFactory(username="other")
    seed_session(user=user, messages=spec.size, title="s0")
    # Another user's messages between the two sessions' ids, as the bench's turns leave them.
    seed_session(user=other, messages=80, title="between")
    seed_session(user=user, messages=spec.size, title="s1")
    chinese = len(range(7, spec.total, 50)) + len(range(32, spec.total, 50))
    assert _plant(user=user, layout=spec) == chinese + 6
    session = ChatSession.objects.filter(owner=user).order_by("-id").first()
    token = Token.objects.create(user=user).key
    for key, query, _what in recipe.QUERIES:
        for chat in (None, session):
            cell = {"key": key, "query": query, "session_id": chat.pk if chat else None}
            # Raises unless the first page is the plain scan's first page, over HTTP too.
            counts = _cell_counts(cell=cell, user=user, session=chat, token=token)
            assert counts["hits"] <= 20 and counts["queries"] >= 1
        walk = _walk(user=user, session=None, query=query)
        everything = ChatMessage.objects.filter(session__owner=user, content__icontains=query)
        assert walk["hits"] == everything.count()
        if recipe.expected_hits(spec.total, key) is not None:
            assert walk["hits"] == recipe.expected_hits(spec.total, key)
    # The short query walks 100 messages a request: several pages, each with a cursor.
    assert _walk(user=user, session=None, query=recipe.RARE_CHINESE_WORD)["pages"] >= 3


def _result(scale: float) -> dict[str, Any]:
    cells = {}
    for key, _query, _what in recipe.QUERIES:
        for label, scope, factor in [
            ("100", "all", 1.0),
            ("100", "session", 1.0),
            ("100-early", "all", 1.0),
            ("5000", "all", scale),
            ("5000", "session", 1.5),
        ]:
            ms = [10.0 * factor] * 10
            cells[f"{key}|{label}|{scope}"] = {
                "http": ms,
                "selector": ms,
                "icontains": [x * 3 for x in ms],
                "rows": None,
                "scan_rows": None,
                "http_queries": 5,
                "hits": 3,
                "more": True,
                **({"walk": {"pages": 4, "hits": 3, "ms": 12.0}} if key == "ident" else {}),
            }
    build = {
        "built_at": "today",
        "analyze_seconds": 1,
        "total_seconds": 90,
        "users": {"100": {"messages": 100, "seed_seconds": 1, "plant_seconds": 0, "planted": 6}},
    }
    return {"label": "SQLite", "version": "SQLite 3", "build": build, "cells": cells}


def test_report_compares_each_cell_with_the_baseline_of_its_scope() -> None:
    layout = "100,5000"
    rows = search_bench.ratios(_result(3.0)["cells"], layout)
    # The early copy and the large user, every query; "session" only where there is one.
    assert {(r["user"], r["scope"]) for r in rows} == {
        ("100-early", "all"),
        ("5000", "all"),
        ("5000", "session"),
    }
    assert all(
        r["http"] == pytest.approx(3.0) for r in rows if r["user"] == "5000" and r["scope"] == "all"
    )
    args = argparse.Namespace(search_warmup=1, search_repeats=10, search_scan_repeats=10)
    text = search_bench.render(results=[_result(3.0)], layout=layout, args=args, command="cmd")
    assert "| common | 5,000 | all | 3.00x | **no** |" in text
    assert "| common | 5,000 | session | 1.50x | yes |" in text
    assert "| ident | 100 (oldest ids) | all | 4 | 12.0 | 3 |" in text
    assert "3 (+ cursor)" in text and "1.5 min in all" in text
