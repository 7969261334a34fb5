"""Semantic recall (chat/search/semantic.py, its merge in chat/search/recall_auto.py): off
unless an embedding model is configured; then messages are embedded in the background after a
reply, the new message is embedded at send time, and the nearest messages of the session join
the lexical ranking. Against the fake server's /v1/embeddings, whose vectors fold synonyms
("pets" and "cat" are one concept: devtools/fakellm/embeddings.py), so a message found only by
meaning proves the semantic side was merged."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from chat.context import context_compact, context_payload_build, context_state_fresh
from chat.context.compose import RecallAsk
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus, MessageVector
from chat.search.recall_auto import recall_auto
from chat.search.semantic import (
    rank_fuse,
    semantic_nearest,
    semantic_query_vector,
    session_embed_pending,
)
from devtools.introspect import background_wait
from tests.chat.recall_setup import FORGETFUL_SUMMARY as SUMMARY
from tests.chat.recall_setup import SMALL
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)

CAT = "We got another cat last week; Miso sleeps on the sofa all day."
QUESTION = "What pets does she have?"


@pytest.fixture(autouse=True)
def runtime(settings, tmp_path):
    settings.RUNTIME_DIR = tmp_path
    settings.AGENT_MEMORY_STORAGE = ""
    settings.CHAT_CONTEXT = SMALL


@pytest.fixture
def embeddings(fake_llm, settings):
    settings.LLM_EMBEDDING_MODEL = "fake-embedding"
    settings.LLM_EMBEDDING_BASE_URL = fake_llm.base_url
    settings.LLM_EMBEDDING_API_KEY = "test-key"
    settings.LLM_EMBEDDING_BATCH = 8
    settings.LLM_EMBEDDING_TIMEOUT_SECONDS = 2.0
    settings.LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS = 0.5
    return fake_llm


def _archived(owner, fake_llm) -> tuple[ChatSession, ChatMessage]:
    """A session whose first turn (the cat) is summarised away by a summary that drops it."""
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    cat = ChatMessage.objects.create(session=session, role=MessageRole.USER, content=CAT)
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="Lovely!")
    make_conversation(session, turns=12, words=12)
    fake_llm.script_summary(SUMMARY)
    assert context_compact(session_id=session.pk, trigger="manual", force=True).outcome == (
        "committed"
    )
    session.refresh_from_db()
    assert (session.verbatim_since_message_id or 0) > cat.pk
    # The turn before the question (the query's context) shares no word with the archive.
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="Sunny today?")
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="Warm, too.")
    return session, cat


def _payload_for(session, question):
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content=question)
    state = context_state_fresh(session_id=session.pk, query=question)
    return context_payload_build(state=state, recall=recall_auto)


def _ask(session, *, owner_id=None, query=QUESTION) -> RecallAsk:
    return RecallAsk(
        session_id=session.pk,
        owner_id=session.owner_id if owner_id is None else owner_id,
        below_id=session.verbatim_since_message_id,
        gap=(),
        query=query,
        context="",
        room=4000,
        messages=session.message_count,
    )


def test_lexical_recall_alone_does_not_find_the_cat(owner, fake_llm):
    session, _ = _archived(owner, fake_llm)
    payload = _payload_for(session, QUESTION)
    assert "another cat" not in payload.messages[0]["content"]
    assert fake_llm.embedding_inputs == []  # off: nothing is embedded, nothing asked
    assert not MessageVector.objects.exists()


def test_semantic_candidates_are_merged_into_recall(owner, embeddings, caplog):
    session, cat = _archived(owner, embeddings)
    assert session_embed_pending(session_id=session.pk) == 2 + 24 + 2
    with caplog.at_level(logging.INFO, logger="chat.search"):
        payload = _payload_for(session, QUESTION)
    system = payload.messages[0]["content"]
    assert f"> user: {CAT}\n> assistant: Lovely!" in system  # with its neighbour, as lexical
    line = next(r.message for r in caplog.records if "chat_context_recall" in r.message)
    assert "semantic=" in line and "semantic=0" not in line
    # One request on the send's path: the new message and the turn before it.
    assert embeddings.embedding_inputs[-1] == [QUESTION, "Sunny today?\nWarm, too."]
    nearest = semantic_nearest(_ask(session), semantic_query_vector(_ask(session)))
    assert nearest[0] == cat.pk


def test_lexical_and_semantic_candidates_both_recalled(owner, embeddings):
    session, cat = _archived(owner, embeddings)
    door = "The door code is 4471-KX."
    # Far from the cat: each is recalled for itself, not as the other's neighbour.
    ChatMessage.objects.filter(pk=cat.pk + 12).update(content=door)
    session_embed_pending(session_id=session.pk)
    system = _payload_for(session, "Which pets, and which door code?").messages[0]["content"]
    assert CAT in system and door in system


def test_embedding_skips_what_the_model_is_never_sent_and_batches(owner, embeddings):
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=10, words=3)
    skipped = [
        ChatMessage.objects.create(session=session, role=MessageRole.TOOL, content="fetched"),
        ChatMessage.objects.create(
            session=session, role=MessageRole.ASSISTANT, content="half", status="streaming"
        ),
        ChatMessage.objects.create(
            session=session, role=MessageRole.ASSISTANT, content="oops", status="failed"
        ),
        ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content=""),
    ]
    assert session_embed_pending(session_id=session.pk) == 20
    assert [len(call) for call in embeddings.embedding_inputs] == [8, 8, 4]
    assert not MessageVector.objects.filter(message__in=skipped).exists()
    vector = MessageVector.objects.first()
    assert vector is not None and vector.model == "fake-embedding"
    assert len(bytes(vector.embedding)) == 64 * 2  # float16
    # Nothing pending: no request. A reply that completes later is embedded then.
    assert session_embed_pending(session_id=session.pk) == 0
    assert len(embeddings.embedding_inputs) == 3
    ChatMessage.objects.filter(pk=skipped[1].pk).update(status=MessageStatus.COMPLETE)
    assert session_embed_pending(session_id=session.pk) == 1


def test_a_failing_server_loses_nothing(owner, embeddings, settings, caplog):
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=6, words=3)
    embeddings.embeddings_fail(times=1, status=503)
    with caplog.at_level(logging.WARNING, logger="chat.search"):
        assert session_embed_pending(session_id=session.pk) == 0
    assert any("chat_embedding_failed" in r.message for r in caplog.records)
    assert session_embed_pending(session_id=session.pk) == 12  # the next run has them all
    # A 500 for the batch, and for each text alone: a failing server, not a text. Nothing
    # is stored empty; all stay pending.
    MessageVector.objects.all().delete()
    embeddings.embeddings_fail(times=1 + 8)
    assert session_embed_pending(session_id=session.pk) == 0
    assert not MessageVector.objects.exists()
    assert session_embed_pending(session_id=session.pk) == 12
    # Another model's vectors are not compared: they are embedded again.
    settings.LLM_EMBEDDING_MODEL = "another-embedding"
    assert session_embed_pending(session_id=session.pk) == 12
    assert set(MessageVector.objects.values_list("model", flat=True)) == {"another-embedding"}


def test_a_text_the_server_refuses_holds_back_no_other(owner, embeddings, caplog):
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=2, words=3)
    long = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="x " * 50)
    make_conversation(session, turns=2, words=3)
    embeddings.embeddings_limit(20)
    with caplog.at_level(logging.WARNING, logger="chat.search"):
        assert session_embed_pending(session_id=session.pk) == 9
    assert any(f"chat_embedding_refused message={long.pk}" in r.message for r in caplog.records)
    # Stored empty: not asked again, never a candidate.
    assert bytes(MessageVector.objects.get(message=long).embedding) == b""
    assert session_embed_pending(session_id=session.pk) == 0
    ask = RecallAsk(
        session_id=session.pk,
        owner_id=owner.pk,
        below_id=long.pk + 100,
        gap=(),
        query="x",
        context="",
        room=4000,
    )
    nearest = semantic_nearest(ask, np.ones(64, dtype=np.float32) / 8)
    assert len(nearest) == 8 and long.pk not in nearest


def test_send_embeds_in_the_background_and_survives_a_failing_server(
    api, owner, embeddings, caplog
):
    session, _ = _archived(owner, embeddings)
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "Hi"}, format="json")
    assert r.status_code == 200, r.content
    background_wait()
    # The whole session, new turn included, embedded after the reply.
    assert MessageVector.objects.filter(session=session).count() == session.messages.count()
    # The query embedding fails, then is too slow: each send is answered, lexically.
    embeddings.embeddings_fail(times=1)
    with caplog.at_level(logging.WARNING, logger="chat.search"):
        r = api.post(
            "/api/v1/chat/send", {"session_id": session.pk, "content": QUESTION}, format="json"
        )
    assert r.status_code == 200, r.content
    assert "another cat" not in embeddings.calls[-1].body["messages"][0]["content"]
    assert any("chat_recall_semantic_failed" in r.message for r in caplog.records)
    background_wait()
    # Slower than the query timeout (0.5 s): the send does not wait for the server's 30 s.
    embeddings.embeddings_delay(30.0)
    caplog.clear()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="chat.search"):
        r = api.post(
            "/api/v1/chat/send", {"session_id": session.pk, "content": QUESTION}, format="json"
        )
    assert r.status_code == 200, r.content
    assert time.monotonic() - started < 20
    assert any(
        "chat_recall_semantic_failed" in r.message and "Timeout" in r.message
        for r in caplog.records
    )
    embeddings.embeddings_delay(0)
    embeddings.release()
    background_wait()
    # And once it answers again, the meaning is recalled on a send.
    r = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": QUESTION}, format="json"
    )
    assert r.status_code == 200, r.content
    assert CAT in embeddings.calls[-1].body["messages"][0]["content"]


def test_nearest_is_owner_scoped_and_below_the_core(owner, outsider, embeddings):
    session, cat = _archived(owner, embeddings)
    session_embed_pending(session_id=session.pk)
    query = semantic_query_vector(_ask(session))
    assert query is not None
    assert semantic_nearest(_ask(session, owner_id=outsider.pk), query) == []
    ask = _ask(session)
    below = RecallAsk(**{**{f: getattr(ask, f) for f in ask.__slots__}, "below_id": cat.pk})
    assert semantic_nearest(below, query) == []  # nothing older than the cat


def test_rank_fusion_puts_what_both_find_first():
    fused = rank_fuse({1: 9.0, 2: 5.0, 3: 5.0}, [4, 2])
    assert max(fused, key=fused.__getitem__) == 2
    assert fused[2] > fused[1] > fused[3] and fused[4] > fused[3]


def test_backfill_command(owner, embeddings, settings):
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=3, words=3)
    call_command("embeddings_backfill")
    assert MessageVector.objects.filter(session=session).count() == 6
    settings.LLM_EMBEDDING_MODEL = ""
    with pytest.raises(CommandError, match="LLM_EMBEDDING_MODEL"):
        call_command("embeddings_backfill")


def test_vectors_go_with_their_session(owner, embeddings):
    session, _ = _archived(owner, embeddings)
    session_embed_pending(session_id=session.pk)
    assert MessageVector.objects.exists()
    ChatSession.objects.filter(pk=session.pk).delete()
    assert not MessageVector.objects.exists()


def test_a_failing_semantic_read_leaves_lexical_recall_whole(
    owner, embeddings, monkeypatch, caplog
):
    session, cat = _archived(owner, embeddings)
    door = "The door code is 4471-KX."
    ChatMessage.objects.filter(pk=cat.pk + 12).update(content=door)
    session_embed_pending(session_id=session.pk)

    def broken(*args, **kwargs):
        raise RuntimeError("vector read failed")

    monkeypatch.setattr("chat.search.semantic.semantic_nearest", broken)
    with caplog.at_level(logging.WARNING, logger="chat.search"):
        system = _payload_for(session, "Which pets, and which door code?").messages[0]["content"]
    assert door in system and CAT not in system
    assert any("chat_recall_semantic_failed" in r.message for r in caplog.records)
