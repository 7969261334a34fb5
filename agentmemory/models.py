"""The flush ledger: one row per batch of a session's messages archived to an agent's daily note
before compaction merged it into the rolling summary. It is what lets a retried compaction skip
a batch that is already in the note, and what an audit reads to prove no compacted message went
unarchived."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class NoteStatus(models.TextChoices):
    PENDING = "pending"  # the row exists, the append may or may not have landed (crash window)
    WRITTEN = "written"  # the block is in the daily note


class ExtractStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"  # retried on the next flush of the session and by memory_retry_extractions
    SKIPPED = "skipped"  # memory_auto_extract off, offline provider, or the messages are gone


class MemoryFlush(models.Model):
    session = models.ForeignKey(
        "chat.ChatSession", on_delete=models.CASCADE, related_name="memory_flushes"
    )
    # SET_NULL: the audit trail of a session outlives the agent it was written for.
    agent = models.ForeignKey(
        "chat.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The archived messages: ids in [from, to] of this session (inclusive).
    from_message_id = models.BigIntegerField()
    to_message_id = models.BigIntegerField()
    message_count = models.PositiveIntegerField(default=0)
    runes = models.PositiveIntegerField(default=0)
    note_date = models.DateField()
    note_heading = models.CharField(max_length=300)
    note_status = models.CharField(
        max_length=16, choices=NoteStatus.choices, default=NoteStatus.PENDING
    )
    extract_status = models.CharField(
        max_length=16, choices=ExtractStatus.choices, default=ExtractStatus.PENDING
    )
    entries_written = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "agent_memory_flushes"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "from_message_id", "to_message_id"],
                name="agent_memory_flush_range_uniq",
            ),
        ]
        indexes = [
            # The per-session watermark (max to_message_id) and the retry sweep.
            models.Index(fields=["session", "-to_message_id"], name="agent_mem_flush_session_idx"),
            models.Index(
                fields=["extract_status"],
                condition=models.Q(extract_status__in=["pending", "failed"]),
                name="agent_mem_flush_retry_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"flush s{self.session_id} #{self.from_message_id}-{self.to_message_id}"
