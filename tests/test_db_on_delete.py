"""ON DELETE in the database (cadau/dbconstraints.py, chat 0005, agentmemory 0002): a raw SQL
delete of a session or an agent does what the ORM's on_delete does, on SQLite and PostgreSQL
(run this file with DATABASE_URL=postgres://... for the latter)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from agentmemory.models import MemoryFlush
from cadau.dbconstraints import DB_ON_DELETE, _q, references_rewrite
from chat.models import (
    Agent,
    ChatMessage,
    ChatSession,
    ContextSnapshot,
    MessageVector,
    SnapshotOutcome,
)
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation

BEFORE = [("chat", "0004_agent_memory_uuid"), ("agentmemory", "0001_initial")]
# PostgreSQL's pg_constraint.confdeltype codes.
_PG_CODES = {"c": "CASCADE", "n": "SET NULL", "a": "NO ACTION", "r": "RESTRICT", "d": "SET DEFAULT"}


def on_delete_actions() -> dict[tuple[str, str], str]:
    """(table, column) -> the database's ON DELETE action, for the foreign keys of
    DB_ON_DELETE whose table exists ("NO ACTION" when it has none)."""
    # Only those that exist: migrated back, a later migration's tables (the vectors) are gone.
    tables = {table for table, *_ in DB_ON_DELETE} & set(connection.introspection.table_names())
    found: dict[tuple[str, str], str] = {}
    with connection.cursor() as cursor:
        for table in sorted(tables):
            if connection.vendor == "sqlite":
                cursor.execute(f"PRAGMA foreign_key_list({_q(table)})")
                # (id, seq, table, from, to, on_update, on_delete, match)
                for row in cursor.fetchall():
                    found[(table, row[3])] = row[6].upper()
            elif connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT att.attname, con.confdeltype FROM pg_constraint con "
                    "JOIN pg_attribute att ON att.attrelid = con.conrelid "
                    "AND att.attnum = con.conkey[1] "
                    "WHERE con.contype = 'f' AND con.conrelid = %s::regclass",
                    [_q(table)],
                )
                for column, code in cursor.fetchall():
                    found[(table, column)] = _PG_CODES[code]
    return found


def _family(owner) -> tuple[Agent, ChatSession]:
    agent: Agent = AgentFactory.create(owner=owner)
    session: ChatSession = ChatSessionFactory.create(owner=owner, agent=agent)
    rows = make_conversation(session, turns=3)
    ContextSnapshot.objects.create(session=session, outcome=SnapshotOutcome.COMMITTED)
    MemoryFlush.objects.create(
        session=session,
        agent=agent,
        from_message_id=rows[0].pk,
        to_message_id=rows[1].pk,
        message_count=2,
        runes=10,
        note_date="2026-03-02",
    )
    return agent, session


def _raw(sql: str, *params) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))


@pytest.mark.django_db
def test_every_listed_foreign_key_has_its_action_in_the_database():
    """Also the guard against a later migration that rebuilds one of these tables (SQLite) or
    re-creates the key (PostgreSQL) and so writes the constraint back without its action."""
    actions = on_delete_actions()
    for table, column, _to, action in DB_ON_DELETE:
        assert actions[(table, column)] == action, (table, column)
    # Keys not listed keep Django's default: a raw delete of a user still needs the ORM.
    assert actions[("chat_sessions", "owner_id")] == "NO ACTION"


@pytest.mark.django_db
def test_a_raw_delete_of_a_session_takes_its_children(owner):
    _agent, session = _family(owner)
    keep_agent, keep = _family(owner)
    _raw("DELETE FROM chat_sessions WHERE id = %s", session.pk)
    assert not ChatMessage.objects.filter(session_id=session.pk).exists()
    assert not ContextSnapshot.objects.filter(session_id=session.pk).exists()
    assert not MemoryFlush.objects.filter(session_id=session.pk).exists()
    # Only that session's.
    assert ChatMessage.objects.filter(session=keep).count() == 6
    assert ContextSnapshot.objects.filter(session=keep).count() == 1
    assert MemoryFlush.objects.filter(session=keep, agent=keep_agent).count() == 1


@pytest.mark.django_db
def test_a_raw_delete_of_an_agent_leaves_its_sessions_without_one(owner):
    agent, session = _family(owner)
    _raw("DELETE FROM agents WHERE id = %s", agent.pk)
    session.refresh_from_db()
    assert session.agent_id is None
    assert ChatMessage.objects.filter(session=session).count() == 6
    flush = MemoryFlush.objects.get(session=session)
    assert flush.agent_id is None


@pytest.mark.django_db
def test_the_orm_still_deletes_as_before(owner):
    agent, session = _family(owner)
    agent.delete()
    session.refresh_from_db()
    assert session.agent_id is None
    session.delete()
    assert not ChatMessage.objects.exists() and not MemoryFlush.objects.exists()


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    """Every app at its newest migration: the tests after this one need the whole schema
    (chat's search index and owner column come after the migrations this test reverses)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_the_migrations_reverse_and_apply_again_keeping_rows_and_ids(owner):
    """Backwards the keys have no action (a raw delete fails, as before the migration);
    forwards again they have it. On SQLite each pass rebuilds the tables: every row, index and
    the id counter survive (an id deleted before is never handed out again)."""
    agent, session = _family(owner)
    last = ChatMessage.objects.create(session=session, role="user", content="last").pk
    ChatMessage.objects.filter(pk=last).delete()  # the highest id is now used but gone
    try:
        _migrate(BEFORE)
        assert on_delete_actions()[("chat_messages", "session_id")] == "NO ACTION"
        assert on_delete_actions()[("chat_sessions", "agent_id")] == "NO ACTION"
        with pytest.raises(IntegrityError), transaction.atomic():
            _raw("DELETE FROM chat_sessions WHERE id = %s", session.pk)
            # PostgreSQL checks the deferred constraint at commit; make it check now.
            if connection.vendor == "postgresql":
                _raw("SET CONSTRAINTS ALL IMMEDIATE")
    finally:
        _migrate(_latest())
    for table, column, _to, action in DB_ON_DELETE:
        assert on_delete_actions()[(table, column)] == action
    assert ChatMessage.objects.filter(session=session).count() == 6
    assert MemoryFlush.objects.filter(session=session, agent=agent).count() == 1
    fresh = ChatMessage.objects.create(session=session, role="user", content="new")
    assert fresh.pk > last
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA foreign_key_check")
            assert cursor.fetchall() == []
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'chat_messages'"
            )
            names = {row[0] for row in cursor.fetchall()}
        assert {"chat_msg_session_id_idx", "chat_msg_session_client_id_uniq"} <= names
    _raw("DELETE FROM chat_sessions WHERE id = %s", session.pk)
    assert not ChatMessage.objects.filter(session_id=session.pk).exists()


CREATE = (
    'CREATE TABLE "t" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, '
    '"s_id" bigint NOT NULL REFERENCES "chat_sessions" ("id") DEFERRABLE INITIALLY DEFERRED, '
    '"a_id" bigint NULL REFERENCES "agents" ("id") DEFERRABLE INITIALLY DEFERRED)'
)


def test_the_sqlite_rewrite_touches_only_the_named_key_and_is_idempotent():
    once = references_rewrite(
        create_sql=CREATE, column="s_id", to_table="chat_sessions", action="CASCADE"
    )
    assert '"s_id" bigint NOT NULL REFERENCES "chat_sessions" ("id") ON DELETE CASCADE DEF' in once
    assert '"a_id" bigint NULL REFERENCES "agents" ("id") DEFERRABLE' in once
    again = references_rewrite(
        create_sql=once, column="s_id", to_table="chat_sessions", action="CASCADE"
    )
    assert again == once
    back = references_rewrite(create_sql=once, column="s_id", to_table="chat_sessions", action=None)
    assert back == CREATE
    with pytest.raises(ValueError, match="found 0 times"):
        references_rewrite(create_sql=CREATE, column="x_id", to_table="agents", action="CASCADE")


def test_what_a_session_deletes_is_all_in_the_databases_cascades():
    """Deleting a session, a truncation and the admin's user delete are raw DELETEs
    (chat/services/sessions.py): the database's ON DELETE does the rest, and no model signal
    is sent. Every relation under a session (its messages' too) must then be in DB_ON_DELETE,
    and no model among them may have a delete receiver, else a new foreign key would make every
    session delete fail on its constraint, and a new receiver would be skipped."""
    from django.db import models
    from django.db.models.signals import post_delete, pre_delete

    listed = {(table, column) for table, column, _to, _action in DB_ON_DELETE}
    walked: set[type[models.Model]] = set()
    stack: list[type[models.Model]] = [ChatSession]
    while stack:
        model = stack.pop()
        if model in walked:
            continue
        walked.add(model)
        assert not pre_delete.has_listeners(model), model
        assert not post_delete.has_listeners(model), model
        # Hidden ones too (related_name="+", as the vectors' session key).
        relations = [
            f
            for f in model._meta.get_fields(include_hidden=True)
            if f.auto_created and not f.concrete and (f.one_to_many or f.one_to_one)
        ]
        for rel in relations:
            child = rel.related_model
            assert (child._meta.db_table, rel.field.column) in listed, (child, rel.field.name)
            if rel.on_delete is models.CASCADE:
                stack.append(child)
    assert {ChatMessage, ContextSnapshot, MemoryFlush, MessageVector} <= walked
