"""Preparing a reply: everything it needs from the database before its model call (the
turn-started hooks, the context, the payload or "compact first"), and the payload as it changes
through a compaction or an overflow's retry."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chat import hooks
from chat.context import (
    ContextState,
    Payload,
    PayloadTooLarge,
    Recaller,
    context_compaction_decide,
    context_payload_build,
    context_state_read,
    context_window_probe_start,
)
from chat.search.recall_auto import recall_auto
from chat.turn.rows import Prepared, Turn

logger = logging.getLogger("chat.reply")


def turn_prepare(turn: Turn) -> Prepared:
    """Everything the reply needs from the database before its model call: the turn-started
    hooks, the context, the payload (or "compact first"). Adapters have it done in the same
    trip to the database as storing the turn: every trip is on the way to the first token."""
    events = turn_started_hooks_run(turn)
    # A hook that reported something (a fact remembered) may have changed what the prompt
    # shows: load it again then; else the one the send's checks loaded stands.
    prompt = None if events else turn.prompt
    # The model server's own word on its window, asked once per model in the background: a
    # read of the context must not start I/O of its own.
    context_window_probe_start(session=turn.session)
    state = context_state_read(session=turn.session, query=turn.query, prompt=prompt)
    prepared = Prepared(
        events=events, state=state, compaction=context_compaction_decide(state=state)
    )
    if prepared.compaction != "now":
        try:
            prepared.payload = context_payload_build(state=state, recall=turn_recaller())
        except PayloadTooLarge as exc:
            prepared.too_large = str(exc)
    return prepared


@dataclass(slots=True, kw_only=True)
class Attempt:
    """What the model is sent, as it changes through a compaction or an overflow's retry."""

    state: ContextState
    payload: Payload | None
    too_large: str = ""
    # Rows read to build the context (operators and the benchmark watch it: ours is the
    # verbatim tail, the seed's loop reads its whole history window every time).
    rows_read: int = 0
    summary_calls: int = 0
    overflows: int = 0

    def rebuild(self, state: ContextState, *, under_runes: int = 0) -> None:
        """The payload of `state`. `under_runes`: the size of a payload the model refused (an
        overflow): recall must not fill the retry back up to it, so a composed payload that
        is not smaller gives way to the plain one."""
        self.state = state
        try:
            self.payload = context_payload_build(state=state, recall=turn_recaller())
            if under_runes and self.payload.recalled and self.payload.runes >= under_runes:
                self.payload = context_payload_build(state=state)
        except PayloadTooLarge as exc:
            self.payload, self.too_large = None, str(exc)


def turn_recaller() -> Recaller | None:
    """Automatic recall for the payload, unless the operator turned it off."""
    return recall_auto if settings.CHAT_CONTEXT_RECALL else None


def turn_started_hooks_run(turn: Turn) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for hook in hooks.turn_started_hooks:
        try:
            events.extend(hook(session=turn.session, user_message=turn.user_message) or [])
        except Exception:
            logger.exception("chat_turn_started_hook_failed session=%s", turn.session.pk)
    return events
