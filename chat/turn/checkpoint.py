"""Checkpoints of the agent tool loop.

Tool results enter the model context in full. When the loop's own payload (the turn's context +
this turn's round trips) passes the session's threshold (`threshold_pct` of the input budget,
with the agent's context overrides), the earlier round trips of this turn are replaced, in the
payload only, by one checkpoint summary; the latest round stays verbatim. Logs:
`chat_agent_context_compact_llm` (done), `chat_agent_context_compact_llm_failed` (then the
oldest round trips are left out of that one call instead) and
`chat_agent_context_compact_skipped` (over the threshold with no earlier round to checkpoint).
Stored messages are never changed; the session's rolling summary is a separate mechanism.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cadau.contextconfig import ContextConfig
from chat.context import SummaryRejected, message_runes, summary_validate
from chat.context.summarise import summarise_call, transcript_render
from chat.llm.base import SUMMARY_MARKER, LLMError, Message

logger = logging.getLogger("chat.toolloop")

CHECKPOINT_PREFIX = "[Checkpoint of my earlier tool work on this request]"
# What the checkpoint summariser is given per message: a 1 MB file read must not make the
# checkpoint call itself overflow.
CHECKPOINT_RESULT_MAX_RUNES = 20_000
CHECKPOINT_MIN_RUNES = 500

CHECKPOINT_SYSTEM_PROMPT = f"""{SUMMARY_MARKER}
You write the checkpoint of an assistant's work in progress on the user's current request: which
tools it called and what they returned that matters (copy exact numbers, names, paths, ids and
error messages), what is already done and what remains to do. Write in the conversation's
language. Reply with the checkpoint only."""


def _runes(messages: Sequence[Message]) -> int:
    return sum(
        message_runes(content=str(m.get("content") or ""), tool_calls=m.get("tool_calls"))
        for m in messages
    )


@dataclass(frozen=True, slots=True)
class _Said:
    """A payload message (an OpenAI dict) as the transcript renderer reads messages."""

    role: str
    content: str
    tool_calls: Any
    tool_call_id: str

    @classmethod
    def of(cls, message: Message) -> _Said:
        return cls(
            role=str(message.get("role") or ""),
            content=str(message.get("content") or ""),
            tool_calls=message.get("tool_calls"),
            tool_call_id=str(message.get("tool_call_id") or ""),
        )


def checkpoint_summarise(
    *, question: str, previous: str, rounds: Sequence[Sequence[Message]], cap: int, input_cap: int
) -> str:
    """One summarising call over this turn's earlier round trips. Raises LLMError or
    SummaryRejected; never returns an unusable checkpoint."""
    trips = transcript_render(
        (_Said.of(m) for r in rounds for m in r), clip=CHECKPOINT_RESULT_MAX_RUNES
    )
    if len(trips) > input_cap:
        trips = "…[older part cut]\n" + trips[-input_cap:]
    result = summarise_call(
        instructions=CHECKPOINT_SYSTEM_PROMPT,
        content=(
            f"The user's request:\n{question or '(unknown)'}\n\n"
            f"Previous checkpoint (may be empty):\n{previous or '(none)'}\n\n"
            f"Tool round trips since then:\n{trips}\n\n"
            f"Return the updated checkpoint in at most {cap} characters."
        ),
        max_tokens=cap,
    )
    return summary_validate(text=result.text, cap=cap)


@dataclass(slots=True)
class LoopWindow:
    """What the model sees during the loop: the turn's payload, an optional checkpoint standing
    for `rounds[:covered]`, and the remaining round trips verbatim."""

    session_id: int
    base: list[Message]
    cfg: ContextConfig
    rounds: list[list[Message]] = field(default_factory=list)
    checkpoint: str = ""
    covered: int = 0
    checkpoints: int = 0

    @property
    def threshold(self) -> int:
        return self.cfg.threshold_runes

    @property
    def question(self) -> str:
        for m in reversed(self.base):
            if m.get("role") == "user":
                return str(m.get("content") or "")
        return ""

    def assemble(
        self, *, kept: Sequence[Sequence[Message]] | None = None, note: str = ""
    ) -> list[Message]:
        out = list(self.base)
        if self.checkpoint:
            out.append({"role": "assistant", "content": f"{CHECKPOINT_PREFIX}\n{self.checkpoint}"})
        if note:
            out.append({"role": "assistant", "content": note})
        for round_messages in self.rounds[self.covered :] if kept is None else kept:
            out.extend(round_messages)
        return out

    def messages_for_call(self) -> list[Message]:
        """Sync (it may make the checkpoint call): run it in a worker thread."""
        messages = self.assemble()
        before = _runes(messages)
        if before <= self.threshold:
            return messages
        earlier = self.rounds[self.covered : -1]
        if not earlier:
            logger.info(
                "chat_agent_context_compact_skipped session=%s runes=%d threshold=%d rounds=%d "
                "reason=nothing_earlier_to_fold",
                self.session_id,
                before,
                self.threshold,
                len(self.rounds),
            )
            return messages
        cap = max(CHECKPOINT_MIN_RUNES, min(self.cfg.summary_cap_runes, self.threshold // 4))
        input_cap = max(4000, self.cfg.input_budget_runes - cap)
        started = time.monotonic()
        try:
            checkpoint = checkpoint_summarise(
                question=self.question[:4000],
                previous=self.checkpoint,
                rounds=earlier,
                cap=cap,
                input_cap=input_cap,
            )
        except (LLMError, SummaryRejected) as exc:
            return self._fallback(before=before, error=f"{type(exc).__name__}: {exc}")
        self.checkpoint = checkpoint
        self.covered = len(self.rounds) - 1
        self.checkpoints += 1
        messages = self.assemble()
        logger.info(
            "chat_agent_context_compact_llm session=%s rounds_folded=%d runes_before=%d "
            "runes_after=%d threshold=%d checkpoint_runes=%d duration_ms=%d",
            self.session_id,
            len(earlier),
            before,
            _runes(messages),
            self.threshold,
            len(checkpoint),
            int((time.monotonic() - started) * 1000),
        )
        return messages

    def _fallback(self, *, before: int, error: str) -> list[Message]:
        """No checkpoint: leave the oldest round trips out of this one call (never the latest),
        with a note saying so. The next call tries a checkpoint again."""
        kept = list(self.rounds[self.covered :])
        dropped = 0

        def note() -> str:
            if not dropped:
                return ""
            return f"[{dropped} earlier tool round(s) of this request left out: context budget]"

        while len(kept) > 1 and _runes(self.assemble(kept=kept, note=note())) > self.threshold:
            kept.pop(0)
            dropped += 1
        messages = self.assemble(kept=kept, note=note())
        logger.warning(
            "chat_agent_context_compact_llm_failed session=%s runes_before=%d runes_after=%d "
            "threshold=%d rounds_dropped=%d error=%s",
            self.session_id,
            before,
            _runes(messages),
            self.threshold,
            dropped,
            error[:300],
        )
        return messages
