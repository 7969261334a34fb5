"""The search index's database objects (chat/migrations/0006 to 0008) and the search's limits:
the owner column every insert path fills, Unicode case on both halves of a search, queries with
nothing to index, the FTS5 table's own consistency checks, and the time limit of a whole search."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from chat.errors import SearchTimeout
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.search import backends, selectors
from chat.search.backends import Scope
from chat.search.selectors import message_ids_search, message_search, search_deadline
from tests.factories import ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db

sqlite_only = pytest.mark.skipif("connection.vendor != 'sqlite'")
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


@pytest.fixture(params=["scan", "index"])
def path(request, monkeypatch):
    if request.param == "index":
        monkeypatch.setattr(selectors, "WINDOW_ROWS", 1)
    return request.param


def _owners(ids: list[int]) -> list[int | None]:
    owners = []
    with connection.cursor() as cursor:
        for message_id in sorted(ids):
            cursor.execute("SELECT owner_id FROM chat_messages WHERE id = %s", [message_id])
            owners.append(cursor.fetchone()[0])
    return owners


def test_every_insert_path_fills_the_owner_column(owner):
    session = ChatSessionFactory(owner=owner)
    created = ChatMessageFactory(session=session)
    bulk = ChatMessage.objects.bulk_create(
        [ChatMessage(session=session, role=MessageRole.USER, content=f"b{i}") for i in range(3)]
    )
    if bulk[0].pk is None:  # a backend that does not return ids
        bulk = list(ChatMessage.objects.filter(content__startswith="b").order_by("id"))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO chat_messages (session_id, role, content, status, tool_call_id, "
            "metadata, created_at, updated_at) VALUES (%s, 'user', 'raw', 'complete', '', '{}', "
            "%s, %s)",
            [session.pk, "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"],
        )
    raw = ChatMessage.objects.get(content="raw")
    ids = [created.pk, *[m.pk for m in bulk], raw.pk]
    assert _owners(ids) == [owner.pk] * 5
    # A full save of an instance (the ORM does not know the column) leaves it alone.
    created.content = "edited"
    created.save()
    assert _owners([created.pk]) == [owner.pk]


def test_unicode_case_is_folded_on_both_halves_of_a_search(owner, path):
    session = ChatSessionFactory(owner=owner)
    german = ChatMessageFactory(session=session, content="ÄRGER mit dem Server")
    russian = ChatMessageFactory(session=session, content="Код двери: 4471")
    ChatMessageFactory(session=session, content="newest")
    scope = Scope(owner_id=owner.pk)
    assert message_ids_search(scope=scope, query="ärger", limit=5).ids == [german.pk]
    assert message_ids_search(scope=scope, query="КОД", limit=5).ids == [russian.pk]


@pytest.mark.parametrize("query", ["---", "a-b", "C#", "!!!", "数据"])
def test_text_without_three_letters_in_a_row_is_a_bounded_scan(owner, query):
    session = ChatSessionFactory(owner=owner)
    hit = ChatMessageFactory(session=session, content=f"x {query} y")
    result = message_ids_search(scope=Scope(owner_id=owner.pk), query=query, limit=5)
    assert result.mode == "scan" and result.ids == [hit.pk]


def test_the_scope_holds_the_owner_even_with_a_session(owner, outsider):
    theirs = ChatSessionFactory(owner=outsider)
    ChatMessageFactory(session=theirs, content="their secret")
    # A caller that forgot session_for_user still finds nothing of another user's.
    scope = Scope(owner_id=owner.pk, session_id=theirs.pk)
    assert message_ids_search(scope=scope, query="secret", limit=5).ids == []


@sqlite_only
def test_fts5_integrity_and_rebuild_agree_with_a_streaming_reply(owner):
    session = ChatSessionFactory(owner=owner)
    ChatMessageFactory(session=session, content="done reply about otters")
    streaming = ChatMessageFactory(
        session=session, content="half a reply about wombats", status=MessageStatus.STREAMING
    )
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO chat_message_fts(chat_message_fts) VALUES ('integrity-check')")
        cursor.execute("INSERT INTO chat_message_fts(chat_message_fts) VALUES ('rebuild')")
    ChatMessage.objects.filter(pk=streaming.pk).update(
        content="a reply about capybaras", status=MessageStatus.COMPLETE
    )
    scope = Scope(owner_id=owner.pk)
    monkey_window = selectors.WINDOW_ROWS
    try:
        selectors.WINDOW_ROWS = 1  # the index alone
        assert message_ids_search(scope=scope, query="wombat", limit=5).ids == []
        assert message_ids_search(scope=scope, query="capybara", limit=5).ids == [streaming.pk]
    finally:
        selectors.WINDOW_ROWS = monkey_window
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO chat_message_fts(chat_message_fts) VALUES ('integrity-check')")


def test_the_time_limit_bounds_the_whole_search_not_each_statement():
    slow = (
        "SELECT pg_sleep(0.15)"
        if connection.vendor == "postgresql"
        else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) "
        "SELECT count(*) FROM c"
    )
    started = time.monotonic()
    with pytest.raises(SearchTimeout), search_deadline(0.3):
        for _ in range(20):
            backends.bounded_rows(slow, [])
    assert time.monotonic() - started < 0.3 + 2 * backends.TIMEOUT_SLACK + 0.2


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_each_statement_carries_its_limit_in_one_round_trip(owner):
    """A send's recall runs outside any transaction: its lookup is one statement with its
    limit in the same message (no savepoint, no limit read, set and put back, no commit), the
    limit still stops a slow statement, and the connection's own limit is untouched after."""
    session = ChatSessionFactory(owner=owner)
    made = ChatMessageFactory(session=session, content="the quokka-7 plan")
    scope = Scope(owner_id=owner.pk, session_id=session.pk, recallable=True)
    assert not connection.in_atomic_block
    with CaptureQueriesContext(connection) as captured, search_deadline(1.0):
        found = backends.index_hits_many(scope=scope, queries=["quokka-7"], limit=5)
    assert found == {"quokka-7": [made.pk]}
    assert len(captured.captured_queries) == 1
    assert captured.captured_queries[0]["sql"].startswith("SET LOCAL statement_timeout = ")
    # One statement longer than the whole limit: only the database's limit can stop it.
    started = time.monotonic()
    with pytest.raises(SearchTimeout), search_deadline(0.3):
        backends.bounded_rows("SELECT pg_sleep(3)", [])
    assert time.monotonic() - started < 1.0
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_transaction_opened_inside_a_search_leaves_no_limit_behind_for_the_next_statement():
    """A search begun outside a transaction that opens one (and reads in it) still sends its
    next statement, after that transaction, with a limit of its own."""
    with search_deadline(5.0):
        with transaction.atomic():
            backends.bounded_rows("SELECT 1", [])
        with CaptureQueriesContext(connection) as captured:
            backends.bounded_rows("SELECT 2", [])
    assert captured.captured_queries[0]["sql"].startswith("SET LOCAL statement_timeout = ")
    assert backends.PG_TIMEOUT.get() is None


@postgres_only
def test_the_callers_own_time_limit_is_put_back(owner):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '30s'")
        message_search(user=owner, query="anything")
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone()[0] == "30s"


def test_a_match_far_into_a_long_message_still_gets_its_snippet(owner):
    session = ChatSessionFactory(owner=owner)
    ChatMessageFactory(session=session, content="word " * 6000 + "the needle-42 at the end")
    hit = message_search(user=owner, query="needle-42").hits[0]
    start, end = hit.highlights[0]
    assert hit.snippet[start:end] == "needle-42"


def test_the_search_objects_exist_after_the_migrations():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE name LIKE 'chat_message%'")
            names = {row[0] for row in cursor.fetchall()}
            assert {
                "chat_message_fts",
                "chat_messages_searchable",
                "chat_message_fts_ai",
                "chat_message_fts_ad",
                "chat_message_fts_au",
                "chat_message_owner_fill",
            } <= names
        else:
            cursor.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c "
                "ON c.oid = i.indexrelid WHERE c.relname IN "
                "('chat_msg_content_trgm_idx', 'chat_msg_owner_id_idx')"
            )
            assert sorted(cursor.fetchall()) == [
                ("chat_msg_content_trgm_idx", True),
                ("chat_msg_owner_id_idx", True),
            ]
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgname = 'chat_message_owner_fill'")
            assert cursor.fetchall() == [("chat_message_owner_fill",)]


def _fts_pages() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM chat_message_fts_data")
        return int(cursor.fetchone()[0])


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_fts5_segments_are_merged_after_a_reply_not_in_the_commit_that_wrote_them(owner):
    """Migration 0008: a commit that indexes a message only adds its segment (merging there
    stalled a send's first token); search_index_tidy, run after each reply's final write,
    merges them, and the index still finds every message."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT v FROM chat_message_fts_config WHERE k = 'automerge'")
        assert cursor.fetchone() == (0,)
        # From one segment: the flush after an earlier transactional test deletes its rows
        # through the index's trigger and leaves those segments behind, and with them the
        # commits below reached FTS5's crisis merge (16 segments) and merged themselves.
        cursor.execute("INSERT INTO chat_message_fts(chat_message_fts) VALUES ('optimize')")
    session = ChatSessionFactory(owner=owner)
    # One commit each, as sends are: one segment each, none merged by the commits.
    messages = [ChatMessageFactory(session=session, content=f"otter {i} swims") for i in range(12)]
    unmerged = _fts_pages()
    backends.search_index_tidy()
    assert _fts_pages() < unmerged
    scope = Scope(owner_id=owner.pk)
    found = message_ids_search(scope=scope, query="otter", limit=20).ids
    assert sorted(found) == sorted(m.pk for m in messages)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO chat_message_fts(chat_message_fts) VALUES ('integrity-check')")


def test_a_finished_reply_tidies_the_search_index(owner, monkeypatch):
    from chat.turn import replies

    tidied = []
    monkeypatch.setattr(replies, "search_index_tidy", lambda: tidied.append(True))
    session = ChatSessionFactory(owner=owner)
    reply = ChatMessageFactory(
        session=session, role=MessageRole.ASSISTANT, content="", status=MessageStatus.STREAMING
    )
    replies.reply_finish(
        message=reply, session=session, content="done", status=MessageStatus.COMPLETE
    )
    replies.reply_finish(message=reply, session=session, content="x", status=MessageStatus.FAILED)
    assert tidied == [True, True]


def test_recalls_raw_reads_give_each_message_its_stored_time_in_utc(owner):
    """Recall's raw reads load created_at with psycopg's own loader on PostgreSQL (not the one
    Django sets): the same instant as the ORM's, aware, in UTC, on both databases."""
    session = ChatSessionFactory.create(owner=owner)
    made = [ChatMessageFactory.create(session=session, content=f"said {i}") for i in range(3)]
    scope = Scope(owner_id=owner.pk, session_id=session.pk)
    # The window's rows carry created_at as the driver gave it; stamp_datetime reads it.
    by_window = {
        row[0]: backends.stamp_datetime(row[3])
        for row in backends.window_rows(scope=scope, rows=10)
    }
    by_id = {row[0]: row[3] for row in backends.rows_by_id(scope=scope, ids=[m.pk for m in made])}
    for message in made:
        stored = ChatMessage.objects.get(pk=message.pk).created_at
        for found in (by_window[message.pk], by_id[message.pk]):
            assert found == stored
            assert found.utcoffset() is not None and found.utcoffset().total_seconds() == 0


@postgres_only
def test_recalls_timestamp_loader_is_its_cursors_alone_and_any_session_zone_reads_utc(owner):
    """psycopg's own loader is registered on recall's cursors only: the connection keeps
    Django's (every other query). A session in another time zone still reads the stored
    instant, in UTC."""
    from psycopg.adapt import PyFormat

    session = ChatSessionFactory.create(owner=owner)
    message = ChatMessageFactory.create(session=session, content="said")
    stored = ChatMessage.objects.get(pk=message.pk).created_at
    scope = Scope(owner_id=owner.pk, session_id=session.pk)
    django_loader = connection.connection.adapters.get_loader(
        connection.connection.adapters.types["timestamptz"].oid, PyFormat.as_pq(PyFormat.TEXT)
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TIME ZONE 'Asia/Kathmandu'")
        (row,) = backends.rows_by_id(scope=scope, ids=[message.pk])
    assert row[3] == stored and row[3].utcoffset().total_seconds() == 0
    after = connection.connection.adapters.get_loader(
        connection.connection.adapters.types["timestamptz"].oid, PyFormat.as_pq(PyFormat.TEXT)
    )
    assert after is django_loader
