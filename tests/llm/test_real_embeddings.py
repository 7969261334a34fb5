"""Semantic recall against a real embedding server: llama-cpp-python serving SmolLM2-135M with
--embedding (tests/fixtures_real_llm.py `real_embedding_server`). SmolLM2 is a chat model, not
an embedding model: what is pinned here is the wire (its answer parsed, one vector per text
of the model's width, deterministic) and the whole path (messages embedded, stored, compared,
the message that says the same thing found first), not the quality of its neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from chat.context.compose import RecallAsk
from chat.llm.embeddings import EmbeddingConfig, embeddings_create
from chat.models import ChatMessage, ChatSession, MessageRole, MessageVector
from chat.search.semantic import semantic_nearest, semantic_query_vector, session_embed_pending
from tests.factories import ChatSessionFactory
from tests.fixtures_real_llm import RealLLM

pytestmark = [pytest.mark.real_llm, pytest.mark.django_db(transaction=True)]

TURNS = [
    "My sister's name is Beatrix and she lives in Lisbon.",
    "The quarterly budget review moved to Thursday at nine.",
    "We adopted two kittens from the shelter last weekend.",
    "The database migration failed because the disk was full.",
    "For dinner I cooked a mushroom risotto with parmesan.",
    "The train to Vienna leaves from platform seven at noon.",
]


def test_the_server_answers_vectors_the_client_reads(real_embeddings: RealLLM):
    config = EmbeddingConfig.from_settings()
    assert config is not None
    first = embeddings_create(config=config, texts=TURNS[:3], timeout=300.0)
    again = embeddings_create(config=config, texts=TURNS[:1], timeout=300.0)
    assert len(first) == 3 and len({len(v) for v in first}) == 1
    assert len(first[0]) == 576  # SmolLM2-135M's hidden size
    assert np.allclose(first[0], again[0], atol=1e-4)  # deterministic
    # The server gets a batch's later texts wrong; the client asks it one by one instead.
    third = embeddings_create(config=config, texts=TURNS[2:3], timeout=300.0)
    assert np.allclose(first[2], third[0], atol=1e-4)
    assert all(abs(float(np.linalg.norm(v)) - 1.0) < 1e-4 for v in first)
    assert not np.allclose(first[0], first[1], atol=1e-3)


def test_messages_embedded_and_the_same_words_found_first(owner, real_embeddings: RealLLM):
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    # This server is asked one text per request (it answers token vectors): few messages.
    rows = [
        ChatMessage.objects.create(session=session, role=MessageRole.USER, content=text)
        for text in TURNS
    ]
    assert session_embed_pending(session_id=session.pk) == len(TURNS)
    assert MessageVector.objects.filter(session=session).count() == len(TURNS)
    ask = RecallAsk(
        session_id=session.pk,
        owner_id=owner.pk,
        below_id=rows[-1].pk + 10,
        gap=(),
        query=TURNS[3],
        context="",
        room=4000,
    )
    query = semantic_query_vector(ask)
    assert query is not None
    nearest = semantic_nearest(ask, query)
    assert nearest[0] == rows[3].pk
