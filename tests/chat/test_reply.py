"""chat/turn/prepare.py, finish.py and replies.py: the database work of one reply, trip by trip.

With 200 sends at once every query of a send is ORM time that holds the GIL while the other
replies' tokens wait (bench/realtime.py), so the count per trip is pinned here: a change that
reads a row back again shows up as a failing number, not as a slower benchmark weeks later."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db.models import F

from chat.context import (
    TAIL_PAGE,
    context_budget_from_db,
    context_budget_from_state,
    context_state_after_reply,
    context_state_fresh,
)
from chat.errors import NotFound, NotLastReply
from chat.models import Agent, ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.services.agents import agent_update
from chat.turn import finish, prepare, replies, turn_regenerate
from chat.turn.checks import SendRequest
from chat.turn.replies import reply_finish
from chat.turn.rows import turn_store
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation


def _tidy() -> int:
    """The statement a reply's end adds on SQLite: the FTS5 index's merge (migration 0008)."""
    from django.db import connection

    return 1 if connection.vendor == "sqlite" else 0


@pytest.fixture
def session(owner):
    # An agent session with some history: the agent's config is read for the context.
    session = ChatSessionFactory(owner=owner, agent=AgentFactory(owner=owner))
    make_conversation(session, turns=3)
    return session


def _sent(session):
    send = SendRequest(user=session.owner, session_id=session.pk, content="hello", client_id=None)
    return turn_store(send=send)


def _regenerated(session):
    turn = _sent(session)
    ChatMessage.objects.filter(pk=turn.reply.pk).update(status=MessageStatus.COMPLETE)
    return turn_regenerate(user=session.owner, session_id=session.pk).turn


# One query, the verbatim tail: the session, its agent and the user message come with the turn,
# whether a send stored it or a regenerate found it.
@pytest.mark.parametrize("begin", [_sent, _regenerated])
def test_prepare_reads_only_the_tail(session, django_assert_num_queries, begin):
    turn = begin(session)
    with django_assert_num_queries(1):
        prepared = prepare.turn_prepare(turn)
    assert prepared.state.session.agent == session.agent
    assert prepared.payload is not None
    assert prepared.payload.messages[-1] == {"role": "user", "content": "hello"}


def _prepared_turn(session):
    turn = _sent(session)
    return turn, prepare.turn_prepare(turn)


def _finish(turn, state, *, same_row=True):
    return finish.reply_result_complete(
        state=state,
        reply=turn.reply,
        same_row=same_row,
        content="the answer",
        metadata={"rounds": 1},
    )


def test_finish_reads_nothing_back_when_the_context_did_not_move(
    session, django_assert_num_queries
):
    turn, prepared = _prepared_turn(session)
    # The guarded UPDATE of the held row and the session's activity stamp, guarded by its
    # context version and agent: the budget is the prepared context plus the reply.
    with django_assert_num_queries(2 + _tidy()):
        result, after = _finish(turn, prepared.state)
    message, budget = result.message, result.context_budget
    stored = ChatMessage.objects.get(pk=message.pk)
    assert stored.status == MessageStatus.COMPLETE and stored.content == "the answer"
    assert stored.metadata == {"reply_to": turn.user_message.pk, "rounds": 1}
    assert message.metadata == stored.metadata
    # Exactly what a fresh read gives: the reply just stored counts, in its place.
    fresh = context_state_fresh(session_id=session.pk)
    assert after.tail == fresh.tail and after.system_prompt == fresh.system_prompt
    assert after.tail[-1].content == "the answer"
    assert budget == context_budget_from_db(session_id=session.pk)
    assert ChatSession.objects.get(pk=session.pk).last_activity_at == message.updated_at
    # Hooks and the compaction decision run on what the finish worked out: no query either.
    with django_assert_num_queries(0):
        finish.after_reply_run(after=after, turn=turn, reply=message, query_runes=5)


def _compacted(session):
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary="A summary that a compaction committed meanwhile.",
        context_version=F("context_version") + 1,
    )


def _agent_edited(session):
    agent_update(agent=Agent.objects.get(pk=session.agent_id), system_prompt="Be terse. " * 40)


def _agent_swapped(session):
    ChatSession.objects.filter(pk=session.pk).update(agent=AgentFactory(owner=session.owner))


@pytest.mark.parametrize("move", [_compacted, _agent_edited, _agent_swapped])
def test_finish_reads_the_context_fresh_when_it_moved_during_the_reply(
    session, django_assert_num_queries, move
):
    turn, prepared = _prepared_turn(session)
    move(session)
    # The guarded stamp misses, so the stamp again unguarded, then session and tail fresh.
    with django_assert_num_queries(5 + _tidy()):
        result, after = _finish(turn, prepared.state)
    budget = result.context_budget
    assert budget == context_budget_from_db(session_id=session.pk)
    assert budget != context_budget_from_state(state=prepared.state)
    assert ChatSession.objects.get(pk=session.pk).last_activity_at == result.message.updated_at
    assert after.tail[-1].content == "the answer"


def test_finish_of_a_later_tool_round_row_reads_the_context_fresh(
    session, django_assert_num_queries
):
    """Tool rounds stored rows the prepared state never saw: the update and the stamp, then
    the session and its tail fresh."""
    turn, prepared = _prepared_turn(session)
    with django_assert_num_queries(4 + _tidy()):
        result, _ = _finish(turn, prepared.state, same_row=False)
    assert result.context_budget == context_budget_from_db(session_id=session.pk)


def test_the_context_after_a_reply_is_read_fresh_where_it_could_differ(
    session, django_assert_num_queries
):
    turn, prepared = _prepared_turn(session)
    reply_row, state = turn.reply, prepared.state
    with django_assert_num_queries(0):
        context_state_after_reply(state=state, message=reply_row, unchanged=True)
    # Moved meanwhile; a read that stopped before the anchor, or took a full page (the next
    # one may stop elsewhere); a row older than the tail's newest: a fresh read (2 queries).
    older = ChatMessage.objects.filter(session=session).order_by("id").first()
    for kwargs in (
        {"state": state, "message": reply_row, "unchanged": False},
        {"state": replace(state, backlog=True), "message": reply_row, "unchanged": True},
        {"state": replace(state, rows_read=TAIL_PAGE), "message": reply_row, "unchanged": True},
        {"state": state, "message": older, "unchanged": True},
    ):
        with django_assert_num_queries(2):
            after = context_state_after_reply(**kwargs)
        assert after.tail == context_state_fresh(session_id=session.pk).tail


def test_a_held_row_that_stopped_streaming_is_finished_the_long_way(session):
    """Swept as stale meanwhile (say): the guarded write changes nothing, the locked write
    stores the reply, and the metadata the sweep added is kept."""
    turn = _sent(session)
    held = turn.reply
    ChatMessage.objects.filter(pk=held.pk).update(
        status=MessageStatus.FAILED, metadata={"reply_to": turn.user_message.pk, "swept": 1}
    )
    finished = reply_finish(
        message=held,
        session=turn.session,
        content="the answer",
        status=MessageStatus.COMPLETE,
        metadata={"rounds": 1},
    )
    assert not finished.context_unchanged
    stored = ChatMessage.objects.get(pk=held.pk)
    assert stored.status == MessageStatus.COMPLETE and stored.content == "the answer"
    assert stored.metadata["swept"] == 1 and stored.metadata["rounds"] == 1
    assert finished.message.pk == held.pk


def test_a_finish_that_fails_midway_stores_nothing(transactional_db, session, monkeypatch):
    """The reply and the session's stamp are one transaction: a connection lost between them
    (a database restart) must not leave a complete reply whose stamp never moved, while the
    caller, seeing an error, reports the reply failed."""
    from django.db import DatabaseError
    from django.db.models import QuerySet

    turn = _sent(session)
    update = QuerySet.update

    def update_failing_for_sessions(self, **kwargs):
        if self.model is ChatSession:
            raise DatabaseError("server closed the connection unexpectedly")
        return update(self, **kwargs)

    monkeypatch.setattr(QuerySet, "update", update_failing_for_sessions)
    with pytest.raises(DatabaseError):
        reply_finish(
            message=turn.reply,
            session=turn.session,
            content="the answer",
            status=MessageStatus.COMPLETE,
        )
    monkeypatch.undo()
    stored = ChatMessage.objects.get(pk=turn.reply.pk)
    assert stored.status == MessageStatus.STREAMING and stored.content == ""


@pytest.mark.parametrize("race", ["truncated", "sent", "deleted"])
def test_a_regenerate_whose_reply_went_meanwhile_is_refused_not_a_500(session, race):
    """The regenerate picks the session's last reply, then locks the session to restart it: a
    truncation in between deleted the row (its save changed nothing and raised DatabaseError,
    a 500), a send put a newer message after it, the session was deleted (its lock raised
    DoesNotExist, a 500). Asked again under the lock: NotLastReply (400), NotFound (404),
    nothing changed."""
    make_conversation(session, turns=2)
    reply = ChatMessage.objects.filter(session=session).order_by("-id").first()
    assert reply.role == MessageRole.ASSISTANT
    if race == "truncated":
        ChatMessage.objects.filter(pk=reply.pk).delete()
    elif race == "sent":
        ChatMessage.objects.create(session=session, role=MessageRole.USER, content="later")
    else:
        ChatSession.objects.filter(pk=session.pk).delete()
    before = list(ChatMessage.objects.filter(session=session).values_list("id", "status"))
    with pytest.raises(NotFound if race == "deleted" else NotLastReply):
        replies.reply_restart(session=session, reply=reply)
    assert list(ChatMessage.objects.filter(session=session).values_list("id", "status")) == before
