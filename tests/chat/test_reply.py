"""chat/services/reply.py: the database work of one reply, trip by trip.

With 200 sends at once every query of a send is ORM time that holds the GIL while the other
replies' tokens wait (bench/realtime.py), so the count per trip is pinned here: a change that
reads a row back again shows up as a failing number, not as a slower benchmark weeks later."""

from __future__ import annotations

import pytest

from chat.models import ChatMessage, MessageStatus
from chat.services import reply
from chat.services.context import context_budget_read
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


def test_finish_and_after_reply_read_the_session_once(session, django_assert_num_queries):
    started = turn_start(session=session, content="hello", client_id=None)
    assert started.assistant_message is not None
    # One guarded UPDATE of the held row, the session's activity stamp, and one fresh read of
    # session and tail for the budget.
    with django_assert_num_queries(4):
        message, budget, after = reply._finish(
            session_id=session.pk,
            message_id=started.assistant_message.pk,
            held=started.assistant_message,
            content="the answer",
            status=MessageStatus.COMPLETE,
            metadata={"rounds": 1},
        )
    stored = ChatMessage.objects.get(pk=message.pk)
    assert stored.status == MessageStatus.COMPLETE and stored.content == "the answer"
    assert stored.metadata == {"reply_to": started.user_message.pk, "rounds": 1}
    assert message.metadata == stored.metadata
    # The budget counts the reply just stored.
    assert after.tail[-1].content == "the answer"
    assert budget == context_budget_read(session_id=session.pk)
    # Hooks and the compaction decision run on what the finish read: no query of their own.
    with django_assert_num_queries(0):
        reply._after_reply(
            after=after, user_message=started.user_message, assistant=message, query_runes=5
        )


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
