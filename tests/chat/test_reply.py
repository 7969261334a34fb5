"""chat/services/reply.py: the database work of one reply, trip by trip.

With 200 sends at once every query of a send is ORM time that holds the GIL while the other
replies' tokens wait (bench/realtime.py), so the count per trip is pinned here: a change that
reads a row back again shows up as a failing number, not as a slower benchmark weeks later."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db.models import F

from chat.models import Agent, ChatMessage, ChatSession, MessageStatus
from chat.services import reply
from chat.services.agents import agent_update
from chat.services.context import (
    TAIL_PAGE,
    context_budget_of,
    context_budget_read,
    context_state_appended,
    context_state_fresh,
)
from chat.services.messages import reply_complete, turn_start
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation


@pytest.fixture
def session(owner):
    # An agent session with some history: the agent's config is read for the context.
    session = ChatSessionFactory(owner=owner, agent=AgentFactory(owner=owner))
    make_conversation(session, turns=3)
    return session


# With the turn: one query, the verbatim tail (session, agent and user message come from
# turn_start). Without it (REST regenerate), the reply row and the user message are read too.
@pytest.mark.parametrize(("pass_turn", "queries"), [(True, 1), (False, 3)])
def test_prepare_reuses_the_rows_turn_start_stored(
    session, django_assert_num_queries, pass_turn, queries
):
    started = turn_start(session=session, content="hello", client_id=None)
    assert started.assistant_message is not None
    turn = started if pass_turn else None
    with django_assert_num_queries(queries):
        prepared = reply._prepare(started.assistant_message.pk, session.pk, "hello", turn)
    assert prepared.user_message == started.user_message
    assert prepared.session.agent == session.agent
    assert prepared.payload is not None
    assert prepared.payload.messages[-1] == {"role": "user", "content": "hello"}


def _prepared_turn(session):
    started = turn_start(session=session, content="hello", client_id=None)
    assert started.assistant_message is not None
    prepared = reply._prepare(started.assistant_message.pk, session.pk, "hello", started)
    return started, prepared


def _finish_held(started, context):
    return reply._finish(
        session_id=started.user_message.session_id,
        message_id=started.assistant_message.pk,
        held=started.assistant_message,
        context=context,
        content="the answer",
        status=MessageStatus.COMPLETE,
        metadata={"rounds": 1},
    )


def test_finish_reads_nothing_back_when_the_context_did_not_move(
    session, django_assert_num_queries
):
    started, prepared = _prepared_turn(session)
    # The guarded UPDATE of the held row and the session's activity stamp, guarded by its
    # context version and agent: the budget is the prepared context plus the reply.
    with django_assert_num_queries(2):
        message, budget, after = _finish_held(started, prepared.state)
    stored = ChatMessage.objects.get(pk=message.pk)
    assert stored.status == MessageStatus.COMPLETE and stored.content == "the answer"
    assert stored.metadata == {"reply_to": started.user_message.pk, "rounds": 1}
    assert message.metadata == stored.metadata
    # Exactly what a fresh read gives: the reply just stored counts, in its place.
    fresh = context_state_fresh(session_id=session.pk)
    assert after.tail == fresh.tail and after.system_prompt == fresh.system_prompt
    assert after.tail[-1].content == "the answer"
    assert budget == context_budget_read(session_id=session.pk)
    assert ChatSession.objects.get(pk=session.pk).last_activity_at == message.updated_at
    # Hooks and the compaction decision run on what the finish worked out: no query either.
    with django_assert_num_queries(0):
        reply._after_reply(
            after=after, user_message=started.user_message, assistant=message, query_runes=5
        )


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
    started, prepared = _prepared_turn(session)
    move(session)
    # The guarded stamp misses, so the stamp again unguarded, then session and tail fresh.
    with django_assert_num_queries(5):
        message, budget, after = _finish_held(started, prepared.state)
    assert budget == context_budget_read(session_id=session.pk)
    assert budget != context_budget_of(state=prepared.state)
    assert ChatSession.objects.get(pk=session.pk).last_activity_at == message.updated_at
    assert after.tail[-1].content == "the answer"


def test_finish_without_the_turns_context_reads_it_fresh(session, django_assert_num_queries):
    started, _ = _prepared_turn(session)
    with django_assert_num_queries(4):
        _, budget, _ = _finish_held(started, None)
    assert budget == context_budget_read(session_id=session.pk)


def test_appended_context_is_refused_where_a_fresh_read_could_differ(session):
    started, prepared = _prepared_turn(session)
    reply_row = started.assistant_message
    state = prepared.state
    assert context_state_appended(state=state, message=reply_row) is not None
    # A read that stopped before the anchor, or took a full page: the next one may stop
    # elsewhere.
    assert context_state_appended(state=replace(state, backlog=True), message=reply_row) is None
    full = replace(state, rows_read=TAIL_PAGE)
    assert context_state_appended(state=full, message=reply_row) is None
    # A row older than the tail's newest is not "appended".
    older = ChatMessage.objects.filter(session=session).order_by("id").first()
    assert context_state_appended(state=state, message=older) is None


def test_a_held_row_that_stopped_streaming_is_finished_the_long_way(session):
    """Swept as stale meanwhile (say): the guarded write changes nothing, reply_finish stores
    the reply, and the metadata the sweep added is kept."""
    started = turn_start(session=session, content="hello", client_id=None)
    held = started.assistant_message
    assert held is not None
    ChatMessage.objects.filter(pk=held.pk).update(
        status=MessageStatus.FAILED, metadata={"reply_to": started.user_message.pk, "swept": 1}
    )
    assert reply_complete(message=held, content="x", metadata={}) is None
    assert ChatMessage.objects.get(pk=held.pk).status == MessageStatus.FAILED
    message, _, _ = reply._finish(
        session_id=session.pk,
        message_id=held.pk,
        held=held,
        content="the answer",
        status=MessageStatus.COMPLETE,
        metadata={"rounds": 1},
    )
    stored = ChatMessage.objects.get(pk=held.pk)
    assert stored.status == MessageStatus.COMPLETE and stored.content == "the answer"
    assert stored.metadata["swept"] == 1 and stored.metadata["rounds"] == 1
    assert message.pk == held.pk
