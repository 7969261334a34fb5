"""The client of an OpenAI-compatible `POST /v1/embeddings` (semantic recall, docs/search.md).

Sync, on httpx's own transport: its callers are sync (the background embedder's thread, and the
payload build, which runs in a worker thread), and one request per send or per batch needs
none of the streaming client's pooling on the event loop (chat/llm/transport.py). No retries:
the embedder tries again with the next turn, and a send recalls lexically rather than wait.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings

logger = logging.getLogger("chat.llm")


class EmbeddingError(Exception):
    """The server could not be reached, failed, or answered something that is not vectors.
    `status`: the HTTP status when the server answered with an error (None: no answer, or
    not vectors)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def about_the_input(self) -> bool:
        """The server answered an error that may be about one of the texts (llama.cpp's
        "too many tokens" is a 500 in llama-cpp-python, a 400 elsewhere), not a busy or
        unreachable server."""
        return self.status is not None and self.status not in (408, 429, 502, 503, 504)


@dataclass(frozen=True, slots=True)
class EmbeddingConfig:
    base_url: str
    api_key: str
    model: str
    dimensions: int

    @classmethod
    def from_settings(cls) -> EmbeddingConfig | None:
        """The configured embedding model, or None when semantic recall is off."""
        if not settings.LLM_EMBEDDING_MODEL:
            return None
        return cls(
            base_url=settings.LLM_EMBEDDING_BASE_URL.rstrip("/"),
            api_key=settings.LLM_EMBEDDING_API_KEY,
            model=settings.LLM_EMBEDDING_MODEL,
            dimensions=settings.LLM_EMBEDDING_DIMENSIONS,
        )


_shared: httpx.Client | None = None
_shared_lock = threading.Lock()


def _client() -> httpx.Client:
    """One client per process, thread-safe, its connections kept: a new client per request
    loads the CA bundle again (~0.1-0.2 s measured here), on the send's path for the query."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = httpx.Client()
        return _shared


def _pooled(embedding: Any) -> list[float]:
    """One vector. llama-cpp-python answers a model without a pooling layer (a chat model such
    as SmolLM2 served with --embedding) with one vector per token: their mean stands for the
    text, the usual pooling of such models."""
    if embedding and isinstance(embedding[0], list):
        rows = [[float(x) for x in row] for row in embedding]
        width = len(rows[0])
        if any(len(row) != width for row in rows):
            raise ValueError("token vectors of different lengths")
        return [sum(column) / len(rows) for column in zip(*rows, strict=True)]
    return [float(x) for x in embedding]


def _vectors(payload: Any, *, count: int) -> list[list[float]]:
    """The `count` vectors of an embeddings answer, in input order (the API carries an index
    per item; servers are not bound to answer in order), each scaled to unit length so that a
    dot product is the cosine."""
    try:
        items = sorted(payload["data"], key=lambda item: int(item["index"]))
        vectors = [_pooled(item["embedding"]) for item in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise EmbeddingError(f"malformed embeddings answer: {exc!r}") from exc
    if len(vectors) != count or not vectors or any(not v for v in vectors):
        raise EmbeddingError(f"expected {count} vectors, got {len(vectors)}")
    if len({len(v) for v in vectors}) != 1:
        raise EmbeddingError("vectors of different lengths in one answer")
    out = []
    for v in vectors:
        norm = math.sqrt(sum(x * x for x in v))
        if not math.isfinite(norm):
            raise EmbeddingError("a vector holds a non-finite number")
        # An all-zero vector (an empty text on some servers) matches nothing: kept as zeros.
        out.append([x / norm for x in v] if norm else v)
    return out


def _token_level(payload: Any) -> bool:
    try:
        return any(
            item["embedding"] and isinstance(item["embedding"][0], list) for item in payload["data"]
        )
    except (KeyError, TypeError, IndexError):
        return False


def _post(config: EmbeddingConfig, texts: list[str], *, timeout: float) -> Any:
    body: dict[str, Any] = {"model": config.model, "input": texts, "encoding_format": "float"}
    if config.dimensions:
        body["dimensions"] = config.dimensions
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        response = _client().post(
            f"{config.base_url}/embeddings", json=body, headers=headers, timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise EmbeddingError(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise EmbeddingError(
            f"HTTP {response.status_code}: {response.text[:200]}", status=response.status_code
        )
    try:
        return response.json()
    except ValueError as exc:
        raise EmbeddingError("the answer is not JSON") from exc


# Servers (base URL, model) that answer token vectors: asked one text per request from then on.
_one_by_one: set[tuple[str, str]] = set()


def embeddings_create(
    *, config: EmbeddingConfig, texts: list[str], timeout: float
) -> list[list[float]]:
    """One vector per text, unit length, in order; each request within `timeout`. Raises
    EmbeddingError on any failure.

    A server that answers one vector per token (llama-cpp-python serving a model without a
    pooling layer) is asked one text per request: given several, it returns the first text's
    right and the others' wrong (measured with SmolLM2-135M: a text's vector in a batch of
    three had a cosine of 0.01-0.03 with its vector alone). Found out on its first batch,
    which is asked again text by text; remembered for the process. (Then a send's query, two
    texts, may wait twice the query timeout.)"""
    if not texts:
        return []
    key = (config.base_url, config.model)
    if len(texts) > 1 and key in _one_by_one:
        return [_one(config, text, timeout=timeout) for text in texts]
    payload = _post(config, texts, timeout=timeout)
    if len(texts) > 1 and _token_level(payload):
        _one_by_one.add(key)
        logger.warning(
            "chat_embedding_one_by_one model=%s: the server answers token vectors", config.model
        )
        first = _vectors(payload, count=len(texts))[0]
        return [first] + [_one(config, text, timeout=timeout) for text in texts[1:]]
    return _vectors(payload, count=len(texts))


def _one(config: EmbeddingConfig, text: str, *, timeout: float) -> list[float]:
    return _vectors(_post(config, [text], timeout=timeout), count=1)[0]
