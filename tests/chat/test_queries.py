"""chat/queries.py: the raw tail read agrees with the ORM's, on both databases."""

from __future__ import annotations

import pytest

from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.queries import TAIL_COLUMNS, message_rows, message_tail_rows
from chat.search.backends import stamp_datetime
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db

CALLS = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": "ü"}'}}]


def _orm(qs, *, order, limit):
    columns = (*TAIL_COLUMNS, "created_at")
    return list(message_rows(qs, order=order, limit=limit).values_list(*columns))


def _dated(rows):
    """The raw rows with their created_at read as the ORM reads it (SQLite gives text)."""
    return [(*row[:-1], stamp_datetime(row[-1])) for row in rows]


@pytest.mark.parametrize("order", ["id", "-id"])
def test_the_raw_tail_read_returns_what_the_orm_would(order):
    session = ChatSessionFactory()
    other = ChatSessionFactory()
    messages = make_conversation(session, turns=10)
    make_conversation(other, turns=10)  # interleaved ids of another session are left out
    ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="", tool_calls=CALLS
    )
    ChatMessage.objects.create(
        session=session, role=MessageRole.ASSISTANT, content="half", status=MessageStatus.STREAMING
    )
    ids = [m.pk for m in messages]
    qs = ChatMessage.objects.filter(session_id=session.pk)
    cases = [
        ({}, qs),
        ({"from_id": ids[5]}, qs.filter(id__gte=ids[5])),
        ({"below_id": ids[12]}, qs.filter(id__lt=ids[12])),
        ({"from_id": ids[3], "below_id": ids[9]}, qs.filter(id__gte=ids[3], id__lt=ids[9])),
    ]
    for bounds, expected in cases:
        for limit in (1, 5, 100):
            raw = message_tail_rows(session_id=session.pk, order=order, limit=limit, **bounds)
            assert _dated(raw) == _orm(expected, order=order, limit=limit), (bounds, limit)
    newest = message_tail_rows(session_id=session.pk, order="-id", limit=2)
    assert newest[1][3] == CALLS  # decoded, as the JSONField would
    assert newest[0][5] == MessageStatus.STREAMING  # the caller filters, not the SQL


def test_messages_have_one_index_by_session_and_the_reads_by_session_use_it():
    """The foreign key has no single-column index of its own (migration 0014): the session's
    (session_id, id) index serves every read by session, and a session's deletion."""
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "chat_messages")
    by_session = [
        name
        for name, c in constraints.items()
        if c["index"] and c["columns"] and c["columns"][0] == "session_id"
    ]
    assert "chat_msg_session_id_idx" in by_session
    assert not [name for name in by_session if constraints[name]["columns"] == ["session_id"]]
    if connection.vendor != "sqlite":
        return  # PostgreSQL plans a table this small as a scan: its plan says nothing here
    session = ChatSessionFactory()
    make_conversation(session, turns=3)
    for sql in (
        "SELECT id FROM chat_messages WHERE session_id = %s ORDER BY id DESC LIMIT 5",
        "SELECT count(*) FROM chat_messages WHERE session_id = %s",
        "DELETE FROM chat_messages WHERE session_id = %s",
    ):
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, [session.pk])
            plan = " ".join(row[-1] for row in cursor.fetchall())
        assert "USING" in plan and "INDEX" in plan and "SCAN chat_messages" not in plan, plan


def _fields(instance):
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.parametrize("with_agent", [True, False])
def test_the_session_read_returns_what_the_orm_would(with_agent, django_assert_num_queries):
    """session_owned_row writes its SQL once; the ORM's select_related read is the reference
    (every column converted alike: dates, booleans, JSON, UUIDs, NULLs)."""
    from django.utils import timezone

    from chat.queries import session_owned_row
    from tests.factories import AgentFactory

    session = ChatSessionFactory(
        context_summary="## Facts\n- ü", compaction_lease_until=timezone.now()
    )
    if with_agent:
        session.agent = AgentFactory(owner=session.owner, config_json={"tools": ["x"], "n": 1.5})
        session.save()
    expected = ChatSession.objects.select_related("agent", "owner").get(pk=session.pk)
    with django_assert_num_queries(1):
        found = session_owned_row(session_id=session.pk, owner_id=session.owner_id)
        assert found is not None
        assert _fields(found) == _fields(expected)
        assert _fields(found.owner) == _fields(expected.owner)
        if with_agent:
            assert _fields(found.agent) == _fields(expected.agent)
            assert found.agent.config_json == {"tools": ["x"], "n": 1.5}
        else:
            assert found.agent is None
    assert found._state.adding is False and found.owner._state.db == "default"


def test_the_session_read_is_none_for_another_owner_an_inactive_one_or_no_session():
    from chat.queries import session_owned_row

    session = ChatSessionFactory()
    other = ChatSessionFactory()
    assert session_owned_row(session_id=session.pk, owner_id=other.owner_id) is None
    assert session_owned_row(session_id=10**12, owner_id=session.owner_id) is None
    session.owner.is_active = False
    session.owner.save()
    assert session_owned_row(session_id=session.pk, owner_id=session.owner_id) is None


def test_a_message_inserted_in_written_sql_is_the_orms(django_assert_num_queries):
    """message_insert writes the INSERT once per database: every column must come back as
    the ORM's create() stores it (defaults, auto_now, JSON, NULLs), on both databases."""
    from django.db.models.signals import post_save, pre_save
    from django.utils import timezone

    from chat.queries import message_insert

    # The written INSERT sends no model signals: there must be none to miss.
    assert not pre_save.has_listeners(ChatMessage) and not post_save.has_listeners(ChatMessage)
    session, other = ChatSessionFactory(), ChatSessionFactory()
    now = timezone.now()
    cases = [
        {"role": MessageRole.USER, "content": "hello ü", "client_id": "c-1", "created_at": now},
        {
            "role": MessageRole.ASSISTANT,
            "content": "",
            "status": MessageStatus.STREAMING,
            "generator": "proc-1",
            "metadata": {"reply_to": 7, "nested": [1, "ü", None]},
            "tool_calls": CALLS,
            "created_at": now,
        },
        {"role": MessageRole.TOOL, "content": "result", "tool_call_id": "c1"},
    ]
    for fields in cases:
        with django_assert_num_queries(1):
            mine = message_insert(ChatMessage(session=session, **fields))
        theirs = ChatMessage.objects.create(session=other, **fields)  # client_id is per session
        assert mine.pk and mine._state.adding is False
        read, expected = (ChatMessage.objects.get(pk=m.pk) for m in (mine, theirs))
        differs = {
            f.attname
            for f in ChatMessage._meta.concrete_fields
            if getattr(read, f.attname) != getattr(expected, f.attname)
        }
        # The ids and sessions differ, and the moments of the two inserts (auto_now, and
        # created_at's default when not given).
        moments = {"updated_at"} if "created_at" in fields else {"updated_at", "created_at"}
        assert differs <= {"id", "session_id", *moments}, differs
        assert abs((read.updated_at - expected.updated_at).total_seconds()) < 5
        if "created_at" not in fields:
            assert abs((read.created_at - timezone.now()).total_seconds()) < 5
