"""Chat storage. The database keeps every message forever; compaction only ever changes the
session's `context_summary` and its verbatim anchor, never a message row."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Greatest
from django.utils import timezone

# A reply row still `streaming` with no progress saved for this long belongs to no live
# process: a generating process saves progress (updated_at) at least every SAVE_EVERY_SECONDS
# while tokens flow (chat/turn/stream.py).
STALE_STREAMING_SECONDS = 120


def reply_live_since(*, seconds: int = STALE_STREAMING_SECONDS) -> datetime:
    """The one rule for "is this reply being generated": `streaming`, with progress saved
    since this moment, and not orphaned (`reply_orphaned`). Everything that asks (a send's
    busy check, regenerate, truncate, a socket's resume, a repeat's follow, the sweep) asks
    through it."""
    return timezone.now() - timedelta(seconds=seconds)


def reply_orphaned() -> Q:
    """A `streaming` row whose generating process is dead: that process's lease
    (GeneratorLease) has expired, and the row saw no progress for as long. A process renews its
    lease every few seconds while it generates anything (chat/turn/lease.py), so a killed
    process's replies are known dead within CHAT_REPLY_LEASE_SECONDS, not
    STALE_STREAMING_SECONDS. A row without a lease row (its process died before the first
    renewal) falls back to the stale rule."""
    now = timezone.now()
    expired = GeneratorLease.objects.filter(process=OuterRef("generator"), expires_at__lt=now)
    quiet_since = now - timedelta(seconds=settings.CHAT_REPLY_LEASE_SECONDS)
    return Q(Q(updated_at__lt=quiet_since), Exists(expired))


class GeneratorLease(models.Model):
    """A server process that generates replies, alive until `expires_at`: renewed every few
    seconds while it does (chat/turn/lease.py). What other processes go by to tell a reply
    being generated from one whose process was killed."""

    # chat.events.ORIGIN of the process: random per start, so a restarted process never
    # renews the lease of the one it replaces.
    process = models.CharField(max_length=32, primary_key=True)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "chat_generator_leases"

    def __str__(self) -> str:
        return f"{self.process} until {self.expires_at}"


class Agent(models.Model):
    """A configured persona: its own system prompt, model and `config_json` switches."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agents"
    )
    name = models.CharField(max_length=100)
    system_prompt = models.TextField(blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    config_json = models.JSONField(default=dict, blank=True)
    # Names the agent's memory folder ({RUNTIME_DIR}/{memory_uuid}/). Random, not the id: ids
    # restart with a fresh database, and agent 1 of a new user must not find agent 1's files
    # of a previous one (agentmemory/folders.py checks the folder's owner marker too).
    memory_uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "agents"
        ordering = ["-id"]
        indexes = [
            # GET /api/v1/agents: one owner's agents, newest first.
            models.Index(fields=["owner", "-id"], name="agent_owner_id_idx"),
        ]

    def __str__(self) -> str:
        return self.name


class ChatSessionQuerySet(models.QuerySet["ChatSession"]):
    def counters_add(self, *, messages: int, at: datetime | None = None) -> int:
        """The one way the session list's counters change: `messages` more (fewer, when
        negative; never below zero) and the last activity, as one relative UPDATE, so
        concurrent writers never lose a count. The send's store does the same in the SQL
        that also takes the session's lock (chat/turn/rows.py)."""
        fields: dict[str, Any] = {"message_count": Greatest(F("message_count") + messages, 0)}
        if at is not None:
            fields["last_activity_at"] = at
        return self.update(**fields)


class ChatSession(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    # The model this chat's replies go to, chosen in the chat's header among the operator's
    # LLM_ALLOWED_MODELS; "" = the agent's model, else the server's (chat/context/prompt.py).
    model = models.CharField(max_length=200, blank=True, default="")
    # Rolling model context: every message with id < verbatim_since_message_id is represented
    # only by context_summary in the payload; from the anchor on, messages go verbatim. NULL
    # means nothing has been summarised yet. A plain integer, not a FK: the anchor is a position
    # in the id sequence and must survive the anchor message itself being truncated away.
    context_summary = models.TextField(blank=True, default="")
    verbatim_since_message_id = models.BigIntegerField(null=True, blank=True)
    # Compare-and-swap counter: every summary/anchor change bumps it, and a writer only commits
    # if the version is still the one it read, so two concurrent compactions cannot both land.
    context_version = models.PositiveIntegerField(default=0)
    # Moved by every change to messages already stored, other than a reply's own writes in the
    # tail: a truncation, an edit or deletion in the admin. Not by a compaction, which moves
    # only the summary and the anchor: what recall kept of the archive
    # (chat/search/archive_window.py) stays good through it, and a session compacting chunk by
    # chunk (an import's first compaction) does not have its archive read again per chunk.
    messages_version = models.PositiveIntegerField(default=0)
    # Compaction lease: CAS stops two compactions from both *committing*; the lease stops them
    # from both *paying* for a summarising call. Expires on its own if the holder dies.
    compaction_lease_token = models.CharField(max_length=32, blank=True, default="")
    compaction_lease_until = models.DateTimeField(null=True, blank=True)
    # Denormalised so the session list never COUNTs a million-row table per row.
    message_count = models.PositiveIntegerField(default=0)
    last_activity_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ChatSessionQuerySet.as_manager()

    class Meta:
        db_table = "chat_sessions"
        indexes = [
            # GET /api/v1/chat/sessions: keyset over (last_activity_at, id) per owner, newest first.
            models.Index(
                fields=["owner", "-last_activity_at", "-id"], name="chat_session_activity_idx"
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


class MessageRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class MessageStatus(models.TextChoices):
    COMPLETE = "complete"
    STREAMING = "streaming"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Rows that never go to the model: a reply still being written, or one that failed before it
# finished. The context engine's tail read and the session list's budget estimate both skip them.
EXCLUDED_FROM_MODEL = (MessageStatus.STREAMING, MessageStatus.FAILED)


class ChatMessageQuerySet(models.QuerySet["ChatMessage"]):
    def replies_live(self) -> ChatMessageQuerySet:
        """Replies being generated now, in any process (reply_live_since)."""
        return self.filter(
            status=MessageStatus.STREAMING, updated_at__gte=reply_live_since()
        ).exclude(reply_orphaned())

    def replies_stale(self, *, seconds: int = STALE_STREAMING_SECONDS) -> ChatMessageQuerySet:
        """Replies left `streaming` by a process that died: the sweep fails them. `seconds`:
        an operator's own bound (sweep_streaming --older-than)."""
        return self.filter(
            Q(updated_at__lt=reply_live_since(seconds=seconds)) | reply_orphaned(),
            status=MessageStatus.STREAMING,
        )


class ChatMessage(models.Model):
    # No index of its own: chat_msg_session_id_idx (session_id, id) serves every lookup by
    # session (migration 0014).
    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    content = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=16, choices=MessageStatus.choices, default=MessageStatus.COMPLETE
    )
    # Client-chosen idempotency key: the same client_id twice in one session is one message.
    # NULL (not "") when absent, so the per-session unique constraint ignores it.
    client_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    # OpenAI tool-calling metadata: `tool_calls` on an assistant message that requests tools,
    # `tool_call_id` on the tool message answering one of them.
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=128, blank=True, default="")
    # Free-form extras: model name, usage figures, error text of a failed reply, agent events.
    metadata = models.JSONField(default=dict, blank=True)
    # The process generating a `streaming` reply (GeneratorLease.process). NULL when none:
    # a NOT NULL column would make SQLite rebuild the table, and the search index's view
    # over it (migration 0006) with it.
    generator = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ChatMessageQuerySet.as_manager()

    class Meta:
        db_table = "chat_messages"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "client_id"],
                condition=Q(client_id__isnull=False),
                name="chat_msg_session_client_id_uniq",
            ),
        ]
        indexes = [
            # History pages (before/after/around keysets on id) and the verbatim-tail read
            # (id >= anchor) of the context engine: both walk one session's ids in order.
            models.Index(fields=["session", "id"], name="chat_msg_session_id_idx"),
            # GET /api/v1/chat/history/turns: only the user's questions, keyset on id.
            models.Index(
                fields=["session", "id"],
                condition=Q(role="user"),
                name="chat_msg_user_turns_idx",
            ),
            # "Is a reply of this session still generating?" on every send, and the start-up
            # sweep of replies left `streaming` by a crashed process. Partial, so it holds only
            # the few live replies; without it the first query scans the whole session.
            models.Index(
                fields=["session", "updated_at"],
                condition=Q(status="streaming"),
                name="chat_msg_streaming_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role}#{self.pk}"


class SnapshotOutcome(models.TextChoices):
    COMMITTED = "committed"  # summary + anchor changed
    FAILED = "failed"  # the summarising call failed; nothing changed
    REJECTED = "rejected"  # the model answered but the summary was unusable; nothing changed
    CONFLICT = "conflict"  # another writer moved the session first (CAS lost); nothing changed
    RESET = "reset"  # an operator cleared the summary
    REWOUND = "rewound"  # truncation cut into summarised history; summary rolled back


class ContextSnapshot(models.Model):
    """One row per change (or attempted change) of a session's summary: for inspection in the
    admin and the API, and so truncation can rewind to a summary of surviving messages only."""

    #: What operators and API clients see of a snapshot (the admin inline and the context API).
    INSPECTION_FIELDS = (
        "outcome",
        "trigger",
        "strategy",
        "summary",
        "covers_from_message_id",
        "covers_to_message_id",
        "summary_through_message_id",
        "verbatim_since_message_id",
        "context_version",
        "messages_rolled",
        "runes_before",
        "runes_after",
        "llm_calls",
        "model",
        "duration_ms",
        "error",
        "created_at",
    )

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="snapshots")
    outcome = models.CharField(max_length=16, choices=SnapshotOutcome.choices)
    trigger = models.CharField(max_length=32, blank=True, default="")
    strategy = models.CharField(max_length=16, blank=True, default="")
    summary = models.TextField(blank=True, default="")
    # The range compacted into the summary by this step (inclusive), and the state afterwards: the
    # summary stands for every message with id <= summary_through_message_id.
    covers_from_message_id = models.BigIntegerField(null=True, blank=True)
    covers_to_message_id = models.BigIntegerField(null=True, blank=True)
    summary_through_message_id = models.BigIntegerField(null=True, blank=True)
    verbatim_since_message_id = models.BigIntegerField(null=True, blank=True)
    context_version = models.PositiveIntegerField(default=0)
    messages_rolled = models.PositiveIntegerField(default=0)
    runes_before = models.PositiveIntegerField(default=0)
    runes_after = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    model = models.CharField(max_length=200, blank=True, default="")
    duration_ms = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chat_context_snapshots"
        indexes = [
            # Context endpoint / admin inline (newest first) and the truncation rewind lookup
            # (newest committed snapshot whose summary_through is below the cut).
            models.Index(fields=["session", "-id"], name="chat_snapshot_session_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.outcome} snapshot #{self.pk}"


class MessageVector(models.Model):
    """A message's embedding, for semantic recall (docs/search.md). Written after commit by the
    background embedder; only when an embedding model is configured."""

    message = models.OneToOneField(
        ChatMessage, on_delete=models.CASCADE, primary_key=True, related_name="vector"
    )
    # The message's session, so a recall's nearest-neighbour scan reads one session's rows.
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="+")
    # Vectors of different models are not comparable: a changed model re-embeds.
    model = models.CharField(max_length=200)
    # Unit length, float16 little-endian (chat/search/semantic.py `vector_pack`): bytea on
    # PostgreSQL, a BLOB on SQLite, read straight into numpy. Why not pgvector / sqlite-vec:
    # docs/search.md ("Semantic recall").
    embedding = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "chat_message_vectors"
        indexes = [
            models.Index(fields=["session", "message"], name="chat_msg_vector_session_idx"),
        ]

    def __str__(self) -> str:
        return f"vector of #{self.message_id}"
