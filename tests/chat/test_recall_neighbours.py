"""The neighbours of recall's hits (chat/search/recall_neighbours.py): read by range below the
window, and what of a hit's score each takes (a question's answer more than a plain
neighbour)."""

from __future__ import annotations

import re

import pytest

from chat.context.compose import recall_render
from chat.models import MessageRole
from chat.search import recall_auto as recall_auto_module
from chat.search import recall_neighbours
from chat.search.recall_auto import recall_auto
from tests.chat.recall_setup import archived, recall_ask, recall_settings, statements_sent
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def runtime(settings, tmp_path):
    recall_settings(settings, tmp_path)


def test_neighbours_below_the_window_are_read_by_range_not_by_the_whole_session(owner):
    """The neighbours of archive hits are read range by range of the session's index. Written as
    `session_id = ? AND (id BETWEEN ? AND ? OR ...)` with bound parameters, SQLite cannot tell
    how wide a range is, and with a hundred of them walked every message of the session instead
    (430 ms before the first token on a 1M-message session). The plan is asked of the
    statement as sent, with its parameters, and with statistics as a long-lived database has."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's planner (PostgreSQL's cost of the OR form: the docstring's)")
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=2500, words=1)]
    hits = ids[100:4900:48]  # a hundred separate ranges (recall asks up to NEIGHBOURED_MAX)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE chat_messages")
    try:
        out: dict[int, list[tuple[int, int]]] = {}
        with statements_sent() as statements:
            recall_neighbours._looked_up(session_id=session.pk, ids=hits, out=out)
        with connection.cursor() as cursor:
            ((sql, params),) = statements
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            searches = [row[-1] for row in cursor.fetchall() if "chat_messages" in row[-1]]
    finally:
        with connection.cursor() as cursor:
            # Dropped, and forgotten by this connection too: the next tests plan without them.
            cursor.execute("DROP TABLE IF EXISTS sqlite_stat1")
            cursor.execute("ANALYZE sqlite_schema")
    assert out[ids[100]] == [(ids[98], 2), (ids[99], 1), (ids[101], 1), (ids[102], 2)]
    assert sorted(out) == hits
    # Each arm a range of the session's entries (SQLite names the key rowid in its plans).
    ranged = re.compile(r"session_id=\? AND (row)?id>\? AND (row)?id<\?")
    assert searches and all(ranged.search(s) for s in searches), searches


def test_neighbours_past_one_statements_ranges_are_read_in_several(owner, monkeypatch):
    """More ranges than one statement takes (SQLite's compound-select and parameter limits)
    are read in several statements, with the same neighbours as one."""
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=200, words=1)]
    hits = ids[10:390:40]
    whole: dict[int, list[tuple[int, int]]] = {}
    recall_neighbours._looked_up(session_id=session.pk, ids=hits, out=whole)
    monkeypatch.setattr(recall_neighbours, "_ARMS_MAX", 3)
    parts: dict[int, list[tuple[int, int]]] = {}
    recall_neighbours._looked_up(session_id=session.pk, ids=hits, out=parts)
    assert parts == whole and sorted(whole) == hits
    assert whole[hits[0]] == [(ids[8], 2), (ids[9], 1), (ids[11], 1), (ids[12], 2)]


def test_the_answer_to_a_matching_question_outranks_a_weaker_match(owner, monkeypatch):
    """The turn after a hit that asks something is its answer, likely, and seldom repeats the
    question's words: it gets three quarters of the hit's score, not a plain neighbour's half,
    so a room with space for one more turn takes it over a turn matching one word."""
    session = archived(
        owner,
        [
            (MessageRole.USER, "The weekends are long."),
            (MessageRole.ASSISTANT, "What do you do for fun on weekends?"),
            (MessageRole.USER, "Writing and hanging out with friends."),
            *((MessageRole.USER, f"filler chatter number {i} about lunch") for i in range(20)),
        ],
    )
    question = "What does she do for fun on weekends?"
    asked = "> assistant: What do you do for fun on weekends?"
    answer = "> user: Writing and hanging out with friends."
    weaker = "> user: The weekends are long."
    text = recall_render(recall_auto(recall_ask(session, question, room=130)))
    assert asked in text and answer in text and weaker not in text
    # With a plain neighbour's share, the turn matching "weekends" alone wins the room.
    monkeypatch.setattr(recall_neighbours, "ANSWER_SHARE", recall_neighbours.NEIGHBOUR_SHARES[0])
    text = recall_render(recall_auto(recall_ask(session, question, room=130)))
    assert asked in text and weaker in text and answer not in text


@pytest.mark.parametrize(
    "between",
    [[], [(MessageRole.TOOL, "page: the parking rules of the depot")]],
    ids=["next", "after a tool row"],
)
def test_the_answer_to_a_question_older_than_the_window_comes_with_it(owner, monkeypatch, between):
    """Below the window a hit's text is read with its neighbours' (one statement): its answer
    gets the answer's share there too, the first message after it that recall may quote (a
    tool row between is never quoted). (The weaker turn scores 0.72 of the question here,
    between a plain neighbour's share and the answer's.)"""
    session = archived(
        owner,
        [
            (MessageRole.USER, "The van 7731-Q may park here."),
            (MessageRole.ASSISTANT, "Where should the van 7731-Q park tonight?"),
            *between,
            (MessageRole.USER, "Behind the depot, bay nine."),
            *((MessageRole.USER, f"filler chatter number {i} about lunch") for i in range(30)),
        ],
    )
    monkeypatch.setattr(recall_auto_module, "WINDOW_ROWS", 5)
    question = "where did the van 7731-Q park tonight?"
    text = recall_render(recall_auto(recall_ask(session, question, room=145)))
    assert "> assistant: Where should the van 7731-Q park tonight?" in text
    assert "> user: Behind the depot, bay nine." in text
    assert "> user: The van 7731-Q may park here." not in text
    monkeypatch.setattr(recall_neighbours, "ANSWER_SHARE", recall_neighbours.NEIGHBOUR_SHARES[0])
    text = recall_render(recall_auto(recall_ask(session, question, room=145)))
    assert "> user: The van 7731-Q may park here." in text
    assert "> user: Behind the depot, bay nine." not in text
