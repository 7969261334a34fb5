"""The /v1/embeddings client (chat/llm/embeddings.py) against the fake server, and the fake's
vectors (devtools/fakellm/embeddings.py): they must mean something for semantic recall's
tests to prove anything."""

from __future__ import annotations

import logging
import math
import socket

import pytest

from chat.llm.embeddings import EmbeddingConfig, EmbeddingError, _vectors, embeddings_create
from devtools.fakellm.embeddings import DIMENSIONS, text_vector


def _config(fake_llm, *, dimensions: int = 0) -> EmbeddingConfig:
    return EmbeddingConfig(
        base_url=fake_llm.base_url, api_key="k", model="fake-embedding", dimensions=dimensions
    )


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_fake_vectors_fold_synonyms_and_ignore_stop_words():
    pets, cat = text_vector("What pets does she have?"), text_vector("we got another cat")
    assert _cosine(pets, cat) == pytest.approx(1.0)  # one concept each, the same one
    assert _cosine(pets, text_vector("The door code is 4471-KX")) == 0.0
    assert text_vector("what is it") == [0.0] * DIMENSIONS
    assert text_vector("a cat") == text_vector("a cat")  # deterministic across calls


def test_vectors_in_input_order_unit_length(fake_llm):
    texts = ["the door code is 4471-KX", "we got another cat", "sunny and warm today"]
    vectors = embeddings_create(config=_config(fake_llm), texts=texts, timeout=2.0)
    assert len(vectors) == 3 and all(len(v) == DIMENSIONS for v in vectors)
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    assert vectors[1] == pytest.approx(text_vector(texts[1]))
    assert fake_llm.embedding_inputs == [texts]
    assert embeddings_create(config=_config(fake_llm), texts=[], timeout=2.0) == []


def test_dimensions_are_asked_when_configured(fake_llm):
    (vector,) = embeddings_create(
        config=_config(fake_llm, dimensions=16), texts=["a cat"], timeout=2.0
    )
    assert len(vector) == 16


def test_errors_say_whether_the_input_may_be_the_cause(fake_llm):
    fake_llm.embeddings_fail(times=1, status=500)
    with pytest.raises(EmbeddingError) as failed:
        embeddings_create(config=_config(fake_llm), texts=["x"], timeout=2.0)
    assert failed.value.status == 500 and failed.value.about_the_input
    fake_llm.embeddings_fail(times=1, status=503)
    with pytest.raises(EmbeddingError) as busy:
        embeddings_create(config=_config(fake_llm), texts=["x"], timeout=2.0)
    assert busy.value.status == 503 and not busy.value.about_the_input
    fake_llm.embeddings_delay(1.0)
    with pytest.raises(EmbeddingError) as slow:
        embeddings_create(config=_config(fake_llm), texts=["x"], timeout=0.2)
    assert slow.value.status is None and not slow.value.about_the_input


def test_an_unreachable_server_is_an_embedding_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = EmbeddingConfig(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="", model="m", dimensions=0
    )
    with pytest.raises(EmbeddingError):
        embeddings_create(config=config, texts=["x"], timeout=1.0)


def test_answers_parsed_strictly_and_token_vectors_pooled():
    out = [{"index": 1, "embedding": [0.0, 2.0]}, {"index": 0, "embedding": [3.0, 4.0]}]
    assert _vectors({"data": out}, count=2) == [[0.6, 0.8], [0.0, 1.0]]
    # One vector per token (llama-cpp-python, a model without pooling): their mean.
    tokens = {"data": [{"index": 0, "embedding": [[1.0, 0.0], [0.0, 1.0]]}]}
    assert _vectors(tokens, count=1) == [pytest.approx([math.sqrt(0.5), math.sqrt(0.5)])]
    for bad in (
        {},
        {"data": [{"index": 0, "embedding": ["x"]}]},
        {"data": [{"index": 0, "embedding": [1.0]}]},  # one vector for two texts
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]},
        {"data": [{"index": 0, "embedding": [float("inf")]}, {"index": 1, "embedding": [1.0]}]},
    ):
        with pytest.raises(EmbeddingError):
            _vectors(bad, count=2)


def test_a_server_of_token_vectors_is_asked_one_text_at_a_time(fake_llm, caplog):
    """llama-cpp-python serving a chat model: a vector per token, right for a batch's first
    text only. The client finds out on the first batch, asks again one by one, remembers."""
    fake_llm.embeddings_per_token()
    config = EmbeddingConfig(
        base_url=fake_llm.base_url, api_key="", model="per-token", dimensions=0
    )
    texts = ["we got another cat", "the door code", "sunny and warm"]
    with caplog.at_level(logging.WARNING, logger="chat.llm"):
        vectors = embeddings_create(config=config, texts=texts, timeout=2.0)
    assert [v == pytest.approx(text_vector(t)) for v, t in zip(vectors, texts, strict=True)] == [
        True
    ] * 3
    assert fake_llm.embedding_inputs == [texts, texts[1:2], texts[2:3]]
    assert any("chat_embedding_one_by_one" in r.message for r in caplog.records)
    embeddings_create(config=config, texts=texts[:2], timeout=2.0)
    assert fake_llm.embedding_inputs[3:] == [texts[:1], texts[1:2]]
