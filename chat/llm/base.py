"""The one LLM provider interface. Everything that talks to a model goes through it.

Messages are OpenAI chat-completions dicts (`{"role", "content", "tool_calls"?, "tool_call_id"?}`).
Streaming yields `StreamEvent`s; the final event is always `kind="done"` carrying the full text,
the assembled tool calls, the finish reason and usage when the provider reported it.
One call of each kind, each in the flavour its caller needs: `complete` is sync because
summaries run in sync service code (inside worker threads), `astream_chat` async because replies
stream in async consumers; both share one request/response codec. `complete` is the summarising
call (summaries, checkpoints, titles, memory extraction): unless told otherwise it waits
LLM_SUMMARY_TIMEOUT_SECONDS for an answer, where a reply's stream waits LLM_TIMEOUT_SECONDS for
each token, since a whole summary is written before its first byte arrives.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Message = dict[str, Any]


class LLMError(Exception):
    """Any failure talking to the model: connect errors, 4xx/5xx, timeouts, bad payloads."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        #: Seconds the provider asked us to wait (HTTP Retry-After), when it said so.
        self.retry_after = retry_after


class ContextLengthExceeded(LLMError):
    """The provider says the prompt is larger than the model's context window."""


class EmptyStream(LLMError):
    """The server accepted a streamed request (200) and ended the stream without one event.

    llama-cpp-python answers a streamed prompt larger than its context window this way (not
    with a 400: docs/real-llm-notes.md), so a caller that just sent a large prompt should read
    it as the window being exceeded; it is still retried like any short stream, as it can
    also be a server restarting."""


class EmptyReply(LLMError):
    """The model ended its answer properly and said nothing: no text, no tool call.

    Never a reply to store as complete. llama-cpp-python answers this way (`finish_reason`
    "stop", no token) to a prompt that leaves the window no room: after a payload near the
    window it is an overflow; otherwise a failed reply."""

    def __init__(self, message: str, *, finish: dict[str, Any]):
        super().__init__(message, retryable=False)
        self.finish = finish


class Preempted(LLMError):
    """Background work gave a one-slot server up to a reply (chat/llm/slots.py): not retried;
    the work happens later."""


class StreamInterrupted(LLMError):
    """The stream broke after tokens were already produced (partial text is in `partial`)."""

    def __init__(self, message: str, *, partial: str = "", status: int | None = None):
        super().__init__(message, status=status, retryable=False)
        self.partial = partial


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class StreamEvent:
    kind: Literal["delta", "done"]
    text: str = ""  # delta: the new text; done: the whole text
    tool_calls: list[ToolCall] = field(default_factory=list)  # done only
    finish_reason: str | None = None  # done only
    usage: Usage | None = None  # done only
    # delta only: the provider's emit time (time.time()) when its chunk says so (the fake
    # server's `x_emit_ts`); used to measure the latency the app adds per token.
    emitted_at: float | None = None


@dataclass(slots=True)
class Completion:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str = ""


class LLMProvider(Protocol):
    #: "openai" (any OpenAI-compatible endpoint) or "offline".
    name: str
    #: The chat model and the summary model (defaults to the chat model).
    model: str
    summary_model: str

    @property
    def is_offline(self) -> bool: ...

    def complete(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> Completion: ...

    def astream_chat(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[StreamEvent]: ...


#: Callers that ask for a summary put this string in the first system message. Providers that
#: cannot tell a summarising call from a chat call by themselves (the offline provider, the fake
#: server) use it to pick their summary behaviour; real models simply read past it.
SUMMARY_MARKER = "CADAU_SUMMARY_REQUEST"

#: The lines a summarising request wraps the transcript in (chat/context/summarise.py builds its
#: prompt from these). A summary that repeats one echoed its instructions (the summary guard,
#: chat/context/guard.py); the built-in summarisers skip them, as a model should.
SUMMARY_SCAFFOLD = (
    "Existing summary (may be empty):",
    "New transcript excerpt:",
    "Return the merged summary in at most",
    "Extra instructions from the user:",
    "Shorten this summary to at most",
)


def message_text(message: Message) -> str:
    """The text of a message whether `content` is a string, None, or a list of content parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return str(content)


_LENGTH_ASK = re.compile(r"at most (\d{2,7}) characters", re.IGNORECASE)


def requested_max_runes(messages: list[Message]) -> int | None:
    """The length a summarising prompt asks for ("... at most N characters"), which the offline
    and fake summarisers obey the way a real model follows the instruction. The smallest figure
    in the last user message wins."""
    for message in reversed(messages):
        if message.get("role") == "user":
            asks = [int(n) for n in _LENGTH_ASK.findall(message_text(message))]
            return min(asks) if asks else None
    return None


def is_summary_request(messages: list[Message]) -> bool:
    """True when the first system message carries SUMMARY_MARKER (see above)."""
    for message in messages:
        if message.get("role") == "system":
            return SUMMARY_MARKER in message_text(message)
    return False
