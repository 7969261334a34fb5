"""Semantic recall: the messages whose meaning is nearest the new message's, merged into the
lexical ranking of automatic recall (chat/search/recall_auto.py). Only when the operator
configures an embedding model (LLM_EMBEDDING_MODEL); otherwise nothing here runs.

- Writing: after a reply, the session's messages that have no vector of the configured model
  are embedded in the background (`session_embed_later`, one worker thread, batches of
  LLM_EMBEDDING_BATCH), never on a send's path. A failing server loses nothing: what was not
  embedded is still "not embedded" at the next turn, and `manage.py embeddings_backfill` embeds
  a whole database. Tool results and replies the model is never sent are not embedded.
- Reading: at send time the new message and the turn before it are embedded in one request
  under LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS (the one call on the send's path), and the
  session's vectors older than the payload's core are compared with it, exactly, in numpy
  (docs/search.md: why not pgvector or sqlite-vec, and what the read costs). Any failure: no
  semantic candidates, recall stays lexical, the send goes on.
- Merging: reciprocal-rank fusion (Cormack et al., 2009) of the two rankings: it needs no
  common scale between BM25-like sums and cosines, and a message both find comes first.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic

import numpy as np
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from chat.context.compose import RecallAsk
from chat.llm.embeddings import EmbeddingConfig, EmbeddingError, embeddings_create
from chat.models import EXCLUDED_FROM_MODEL, ChatMessage, ChatSession, MessageRole, MessageVector
from chat.search.backends import bounded_rows
from chat.search.selectors import search_deadline
from chat.workers import embedding_submit

logger = logging.getLogger("chat.search")

# Semantic candidates per recall: as many as the lexical side brings of its best.
NEAREST = 20
MIN_SIMILARITY = 0.0
# The read of the session's vectors, on the send's path.
SEMANTIC_SECONDS = 1.0
# Reciprocal-rank fusion's constant: 60 in the paper, and in most systems since.
RRF_K = 60
# What of a message is embedded: its opening, enough to say what it is about, and within an
# embedding model's context (SmolLM2's llama.cpp server refuses inputs over its batch size).
TEXT_RUNES = 1000
# The turn before the new message counts for half, as in the lexical query.
CONTEXT_WEIGHT = 0.5
_ROLES = (MessageRole.USER, MessageRole.ASSISTANT)


# Stored as float16: half the bytes a send reads (the session's vectors, on its path), and a
# cosine's ranking does not need float32's digits (a unit vector's components are far from
# float16's limits; its 3 significant digits move a cosine by ~1e-3).
VECTOR_DTYPE = "<f2"


def vector_pack(vector: list[float]) -> bytes:
    return np.asarray(vector, dtype=VECTOR_DTYPE).tobytes()


def _embeddable(session_id: int, model: str) -> list[tuple[int, str]]:
    rows = (
        ChatMessage.objects.filter(session_id=session_id, role__in=_ROLES)
        .exclude(status__in=EXCLUDED_FROM_MODEL)
        .exclude(content="")
        .exclude(vector__model=model)
        .order_by("id")
        .values_list("id", "content")[: settings.LLM_EMBEDDING_BATCH]
    )
    return list(rows)


def _store(*, session_id: int, model: str, ids: list[int], vectors: list[list[float]]) -> None:
    now = timezone.now()
    rows = [
        MessageVector(
            message_id=mid,
            session_id=session_id,
            model=model,
            embedding=vector_pack(vector),
            created_at=now,
        )
        for mid, vector in zip(ids, vectors, strict=True)
    ]
    try:
        with transaction.atomic():
            MessageVector.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["message"],
                update_fields=["model", "embedding", "created_at"],
            )
    except IntegrityError:
        # A message deleted meanwhile (a truncation, a regenerate): store the others.
        alive = set(ChatMessage.objects.filter(id__in=ids).values_list("id", flat=True))
        with transaction.atomic():
            MessageVector.objects.bulk_create(
                [row for row in rows if row.message_id in alive],
                update_conflicts=True,
                unique_fields=["message"],
                update_fields=["model", "embedding", "created_at"],
            )


def _embed_batch(config: EmbeddingConfig, batch: list[tuple[int, str]]) -> list[list[float]]:
    """The batch's vectors. When the server errs on the batch in a way that may be about one
    text (too long for its batch size, say), the texts are asked one by one; a text that fails
    alone while others pass gets an empty vector: stored, so it is not asked again at every
    turn, and never a candidate (no length matches). Else one such text would hold back every
    message after it, for good. When every text fails, the server is failing: nothing is
    stored, all stay pending."""
    timeout = settings.LLM_EMBEDDING_TIMEOUT_SECONDS
    texts = [content[:TEXT_RUNES] for _, content in batch]
    try:
        return embeddings_create(config=config, texts=texts, timeout=timeout)
    except EmbeddingError as exc:
        if not exc.about_the_input:
            raise
        failed: EmbeddingError = exc
    vectors: list[list[float]] = []
    refused: list[int] = []
    for (mid, _), text in zip(batch, texts, strict=True):
        try:
            vectors += embeddings_create(config=config, texts=[text], timeout=timeout)
        except EmbeddingError as exc:
            if not exc.about_the_input:
                raise
            failed = exc
            refused.append(mid)
            vectors.append([])
    if len(refused) == len(batch):
        raise failed
    for mid in refused:
        logger.warning("chat_embedding_refused message=%s error=%s", mid, failed)
    return vectors


def session_embed_pending(*, session_id: int) -> int:
    """Embed, batch by batch, the session's messages that have no vector of the configured
    model. Returns how many were embedded; stops at the first failure (logged), leaving the
    rest for the next run."""
    config = EmbeddingConfig.from_settings()
    if config is None:
        return 0
    done = 0
    while batch := _embeddable(session_id, config.model):
        try:
            vectors = _embed_batch(config, batch)
        except EmbeddingError as exc:
            logger.warning(
                "chat_embedding_failed session=%s pending=%d error=%s", session_id, len(batch), exc
            )
            break
        _store(
            session_id=session_id, model=config.model, ids=[m for m, _ in batch], vectors=vectors
        )
        done += len(batch)
    if done:
        logger.info("chat_embedding_stored session=%s messages=%d", session_id, done)
    return done


_queued: set[int] = set()
_queued_lock = threading.Lock()


def _embed_queued(*, session_id: int) -> int:
    with _queued_lock:
        _queued.discard(session_id)
    return session_embed_pending(session_id=session_id)


def session_embed_later(*, session_id: int) -> None:
    """Queue the session's embedding on the embedder's thread, once: a session already queued
    is not queued again (its job will find the new messages too). Nothing when off."""
    if not settings.LLM_EMBEDDING_MODEL:
        return
    with _queued_lock:
        if session_id in _queued:
            return
        _queued.add(session_id)
    embedding_submit(_embed_queued, session_id=session_id)


def embeddings_backfill(*, session_ids: list[int] | None = None) -> tuple[int, int]:
    """Embed every session's pending messages now (`manage.py embeddings_backfill`). Returns
    (sessions visited, messages embedded)."""
    if EmbeddingConfig.from_settings() is None:
        return 0, 0
    sessions = ChatSession.objects.order_by("id").values_list("id", flat=True)
    if session_ids is not None:
        sessions = sessions.filter(id__in=session_ids)
    visited = embedded = 0
    for session_id in sessions.iterator():
        visited += 1
        embedded += session_embed_pending(session_id=session_id)
    return visited, embedded


def _upper(ask: RecallAsk) -> int | None:
    """Recall's ids are below this: the archive and the gap, never the payload's core."""
    if ask.gap:
        return max(m.id for m in ask.gap) + 1
    return ask.below_id


def semantic_query_vector(ask: RecallAsk) -> np.ndarray | None:
    """The query's vector: the new message, with the turn before it at half weight, unit
    length. None when off, when the session has no vector to compare it with (no request is
    made), or when the server fails or is slower than the query timeout (logged)."""
    config = EmbeddingConfig.from_settings()
    upper = _upper(ask)
    if config is None or upper is None or not ask.query.strip():
        return None
    stored = MessageVector.objects.filter(
        session_id=ask.session_id, message_id__lt=upper, model=config.model
    )
    if not stored.exists():
        return None
    texts = [ask.query[-TEXT_RUNES:]] + ([ask.context[-TEXT_RUNES:]] if ask.context else [])
    started = monotonic()
    try:
        vectors = embeddings_create(
            config=config, texts=texts, timeout=settings.LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS
        )
    except EmbeddingError as exc:
        logger.warning(
            "chat_recall_semantic_failed session=%s ms=%d error=%s",
            ask.session_id,
            (monotonic() - started) * 1000,
            exc,
        )
        return None
    query = np.asarray(vectors[0], dtype=np.float32)
    if len(vectors) > 1:
        query = query + CONTEXT_WEIGHT * np.asarray(vectors[1], dtype=np.float32)
    norm = float(np.linalg.norm(query))
    return query / norm if norm else None


def semantic_nearest(ask: RecallAsk, query: np.ndarray, *, most: int = NEAREST) -> list[int]:
    """The ids of the session's (owner-checked) embedded messages below the payload's core,
    nearest `query` first, at most `most`."""
    config = EmbeddingConfig.from_settings()
    upper = _upper(ask)
    if config is None or upper is None:
        return []
    if not ChatSession.objects.filter(pk=ask.session_id, owner_id=ask.owner_id).exists():
        return []
    # Raw rows, not model instances: a session's thousands of vectors are read on the send's
    # path, and the ORM's per-row work was most of the time (measured: docs/search.md).
    table = connection.ops.quote_name(MessageVector._meta.db_table)
    # Under the caller's deadline (semantic_recall): what is left of it bounds the statement.
    rows = bounded_rows(
        f"SELECT message_id, embedding FROM {table} "  # noqa: S608
        "WHERE session_id = %s AND message_id < %s AND model = %s",
        [ask.session_id, upper, config.model],
    )
    width = query.shape[0] * np.dtype(VECTOR_DTYPE).itemsize
    ids: list[int] = []
    blobs: list[bytes] = []
    for mid, blob in rows:
        if len(blob) == width:  # a vector of another size: a model renamed, not re-embedded
            ids.append(mid)
            blobs.append(blob)
    if not ids:
        return []
    matrix = np.frombuffer(b"".join(blobs), dtype=VECTOR_DTYPE).reshape(len(ids), query.shape[0])
    similarity = matrix.astype(np.float32) @ query
    best = np.argsort(-similarity, kind="stable")[:most]
    # Nothing in common (orthogonal, or opposed) is no candidate, however few the others.
    return [ids[i] for i in best if similarity[i] > MIN_SIMILARITY]


def semantic_ranking(ask: RecallAsk) -> list[int]:
    """`semantic_nearest` for `ask`'s query; [] when off, when the session has nothing
    embedded, or on any failure (logged): recall is lexical then, and the send goes on. The
    query's HTTP call runs outside any transaction; the read has a deadline of its own (on
    PostgreSQL a statement timeout aborts the transaction it is in: not the lexical one's)."""
    try:
        query = semantic_query_vector(ask)
        if query is None:
            return []
        with search_deadline(SEMANTIC_SECONDS):
            return semantic_nearest(ask, query)
    except Exception:
        logger.warning("chat_recall_semantic_failed session=%s", ask.session_id, exc_info=True)
        return []


def rank_fuse(lexical: dict[int, float], nearest: list[int]) -> dict[int, float]:
    """Reciprocal-rank fusion of the lexical scores and the semantic ranking: each list gives
    a message 1 / (RRF_K + its rank), lexical ties broken as recall breaks them (newest
    first)."""
    fused: dict[int, float] = {}
    for position, mid in enumerate(sorted(lexical, key=lambda m: (-lexical[m], -m)), start=1):
        fused[mid] = 1.0 / (RRF_K + position)
    for position, mid in enumerate(nearest, start=1):
        fused[mid] = fused.get(mid, 0.0) + 1.0 / (RRF_K + position)
    return fused
