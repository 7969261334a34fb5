"""What the fake LLM server answers: scripted replies, faults, recorded calls, and the default
replies (an echo for chat calls, an extractive digest for summary calls)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from typing import Any, Literal

from chat.llm.base import Message, message_text, requested_max_runes
from chat.llm.offline import RUNES_PER_TOKEN, extractive_summary
from devtools.fakellm.summaries import SUMMARY_STYLES, summary_reply

Target = Literal["chat", "summary", "any"]

#: Faults that fail the whole call (the script stays for the retry):
#: http_error (status, retry_after, message) · hang (seconds; after_tokens None: before the
#: response) · context_length (400, code context_length_exceeded, OpenAI's wording) ·
#: overflow_cut (the prompt does not fit, answered as llama-cpp-python does: a 400 when not
#: streaming, a stream that ends before its first token when streaming) · invalid_json (200
#: with a body / stream that is not JSON) · empty (200, empty content) · garbage (200, content
#: "ERROR: ...").
#: Faults that play the scripted reply, changed (the script is consumed):
#: cut (close the connection after `after_tokens` tokens) · hang with after_tokens=K (stall
#: mid-stream) · stream_error (an `{"error": ...}` object in the stream after `after_tokens`
#: tokens, then [DONE]; not streaming: a 200 whose body is that object) · length (finish_reason
#: "length", the reply cut at `after_tokens`, else the request's max_tokens, else halfway) ·
#: interrupted ([DONE] after `after_tokens` tokens, no finish_reason: what llama-cpp-python does
#: to a running stream when another request arrives) ·
#: no_usage (no `usage` anywhere) · think_tags (content starts with `<think>message</think>`) ·
#: reasoning (`reasoning_content` before the content, as DeepSeek and Qwen send it).
#: Shorthands "500", "502", "503", "429" mean http_error with that status.
FAULT_KINDS = frozenset(
    {
        "http_error",
        "hang",
        "context_length",
        "overflow_cut",
        "invalid_json",
        "empty",
        "garbage",
        "cut",
        "stream_error",
        "length",
        "interrupted",
        "no_usage",
        "think_tags",
        "reasoning",
    }
)
_PLAYS_SCRIPT = frozenset(
    {"cut", "stream_error", "length", "interrupted", "no_usage", "think_tags", "reasoning"}
)
#: What a prompt over the configured window gets (`configure(context_overflow=...)`).
OVERFLOW_KINDS = frozenset({"overflow_cut", "context_length", "stream_error"})

GARBAGE_TEXT = "ERROR: upstream model failure (injected by the fake LLM server)"
DEFAULT_THOUGHT = "Okay, the user wants an answer. Let me think about this step by step."
# The window the context_length message quotes when none is configured.
DEFAULT_QUOTED_WINDOW = 8192
# Default summary digest cap when the caller gives no max_tokens: "short".
DEFAULT_SUMMARY_RUNES = 1500


def error_body(
    message: str, *, type_: str, code: str | int | None, param: str | None = None
) -> dict[str, Any]:
    """The OpenAI error envelope every server here uses (llama.cpp adds fields, vLLM too)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def context_length_body(*, window: int | None, prompt_tokens: int) -> dict[str, Any]:
    """OpenAI's (and vLLM's) 400 for an oversized prompt, with this call's figures."""
    window = window or DEFAULT_QUOTED_WINDOW
    requested = max(prompt_tokens, window + 1)
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages "
        f"resulted in {requested} tokens. Please reduce the length of the messages."
    )
    return error_body(
        message, type_="invalid_request_error", code="context_length_exceeded", param="messages"
    )


def llama_cpp_python_overflow_body(
    *, window: int, prompt_tokens: int, max_tokens: int | None
) -> dict[str, Any]:
    """llama-cpp-python's 400 for an oversized prompt (non-streaming; docs/real-llm-notes.md),
    word for word: it prints the request's max_tokens, "None" when there was none."""
    prompt_tokens = max(prompt_tokens, window)
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion."
    )
    return error_body(
        message, type_="invalid_request_error", code="context_length_exceeded", param="messages"
    )


def in_stream_overflow_error() -> dict[str, Any]:
    """llama.cpp's own server's wording for an oversized prompt, as an in-stream error."""
    return error_body(
        "the request exceeds the available context size, try increasing the context size",
        type_="exceed_context_size_error",
        code=400,
    )


_CJK = r"\u2e80-\u9fff\uac00-\ud7af\uff00-\uffef"
_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+\s*|\s+")


def tokenize(text: str) -> list[str]:
    """Words with their trailing space, CJK one character each: pieces join back to `text`."""
    return _TOKEN.findall(text)


@dataclass(slots=True)
class ScriptedReply:
    content: str = ""
    #: [{"name": str, "arguments": str | dict, "id"?: str}]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None  # default: "tool_calls" if tool_calls else "stop"
    token_ms: float | None = None  # override the server's rate for this reply
    #: A thinking model's reasoning, sent as `reasoning_content` before the content.
    reasoning: str = ""
    #: Answer from what the call was sent: the first line of its prompt (any message but the
    #: user's last one) that contains this text, case-insensitive, else "I do not know." A
    #: recall test's model can only quote a fact that reached its payload.
    quote: str = ""

    @classmethod
    def coerce(cls, value: str | dict[str, Any] | ScriptedReply) -> ScriptedReply:
        if isinstance(value, ScriptedReply):
            return value
        if isinstance(value, str):
            return cls(content=value)
        if isinstance(value, dict):
            known = {"content", "tool_calls", "finish_reason", "token_ms", "reasoning", "quote"}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown reply fields: {sorted(unknown)}")
            return cls(
                content=str(value.get("content") or ""),
                tool_calls=list(value.get("tool_calls") or []),
                finish_reason=value.get("finish_reason"),
                token_ms=value.get("token_ms"),
                reasoning=str(value.get("reasoning") or ""),
                quote=str(value.get("quote") or ""),
            )
        raise TypeError(f"cannot script a reply from {type(value).__name__}")


@dataclass(slots=True)
class Fault:
    kind: str
    target: Target = "any"
    times: int = 1
    on_call: int | None = None  # 1-based index among all calls; None = the next matching calls
    status: int = 500
    retry_after: float | None = None
    after_tokens: int | None = None
    seconds: float = 30.0
    message: str = ""

    def __post_init__(self) -> None:
        if self.kind in {"500", "502", "503", "429"}:
            self.status = int(self.kind)
            self.kind = "http_error"
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {sorted(FAULT_KINDS)}")
        if self.target not in ("chat", "summary", "any"):
            raise ValueError(f"unknown target {self.target!r}")
        if self.kind in ("cut", "interrupted") and self.after_tokens is None:
            self.after_tokens = 3
        if self.kind == "stream_error" and self.after_tokens is None:
            self.after_tokens = 0

    def matches(self, *, kind: str) -> bool:
        return self.target in ("any", kind)

    @property
    def plays_script(self) -> bool:
        """True when the call still answers with its scripted reply (changed or cut short);
        False when it fails outright, leaving the script for the retry."""
        return self.kind in _PLAYS_SCRIPT or (self.kind == "hang" and self.after_tokens is not None)

    def shape(self, reply: ScriptedReply, *, max_tokens: int | None) -> ScriptedReply:
        """The reply as this fault changes it (faults that fail the call leave it alone)."""
        if self.kind == "think_tags":
            thought = self.message or DEFAULT_THOUGHT
            return replace(reply, content=f"<think>\n{thought}\n</think>\n\n{reply.content}")
        if self.kind == "reasoning":
            return replace(reply, reasoning=self.message or DEFAULT_THOUGHT)
        if self.kind == "length":
            tokens = tokenize(reply.content)
            keep = self.after_tokens
            if keep is None and max_tokens is not None and max_tokens < len(tokens):
                keep = max_tokens
            if keep is None:
                keep = (len(tokens) + 1) // 2
            content = "".join(tokens[: max(0, keep)])
            return replace(reply, content=content, tool_calls=[], finish_reason="length")
        return reply


@dataclass(slots=True)
class Call:
    index: int  # 1-based, across all kinds
    kind: Literal["chat", "summary"]
    #: The request body as received. Kept as bytes, parsed when asked for: a benchmark makes
    #: thousands of calls of ~50k characters, and as dicts they would make this process's full
    #: garbage collections long enough to stall it, a stall the client would time as Cadau's.
    raw_body: bytes
    headers: dict[str, str]
    stream: bool
    fault: str | None
    received_at: float
    #: When the server began answering: later than received_at when it waited for a slot.
    started_at: float | None = None

    @property
    def body(self) -> dict[str, Any]:
        parsed = json.loads(self.raw_body) if self.raw_body else {}
        return parsed if isinstance(parsed, dict) else {}

    def as_json(self, *, body: bool = True) -> dict[str, Any]:
        """The call for the control API, with `prompt_runes`: the runes of its messages'
        text, what a context budget counts."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        del fields["raw_body"]
        parsed = self.body
        raw = parsed.get("messages")
        messages = raw if isinstance(raw, list) else []
        fields["prompt_runes"] = sum(len(message_text(m)) for m in messages if isinstance(m, dict))
        return {**fields, "body": parsed} if body else fields


@dataclass(slots=True)
class ServerConfig:
    """How the server behaves on every call (faults are per call). See FakeLLMServer.configure."""

    token_ms: float = 0.0
    reply_words: int | None = None
    reject_stream_options: bool = False
    reject_tools: bool = False
    require_api_key: str | None = None
    usage: bool = True
    #: Reported by /v1/models (vLLM `max_model_len`, llama.cpp `meta.n_ctx`); None: not
    #: reported and not enforced.
    context_window: int | None = None
    #: llama.cpp's `meta.n_ctx_train`: the model's training window, which can be far larger
    #: than the window the server actually runs with. None: the same as context_window.
    train_context_window: int | None = None
    #: The fault a prompt of context_window tokens or more gets; None: not enforced.
    context_overflow: str | None = "overflow_cut"
    #: Requests answered at once; 0 is unlimited. With 1, like a llama.cpp server with one
    #: slot, the others queue.
    slots: int = 0
    #: With slots: a running stream ends ([DONE], no finish_reason) as soon as another request
    #: waits for its slot, as llama-cpp-python does by default (--interrupt_requests).
    interrupt_requests: bool = False
    #: How unscripted summary calls are answered (summaries.py: digest, fail, unusable, vague,
    #: good); scripted summary replies and faults come first.
    summary_style: str = "digest"

    def __post_init__(self) -> None:
        if self.context_overflow is not None and self.context_overflow not in OVERFLOW_KINDS:
            raise ValueError(
                f"context_overflow must be one of {sorted(OVERFLOW_KINDS)} or None, "
                f"not {self.context_overflow!r}"
            )
        if self.slots < 0:
            raise ValueError("slots must be 0 (unlimited) or more")
        if self.summary_style not in SUMMARY_STYLES:
            raise ValueError(f"summary_style must be one of {', '.join(SUMMARY_STYLES)}")

    def overflows(self, prompt_tokens: int) -> bool:
        window = self.context_window
        return bool(window and self.context_overflow and prompt_tokens >= window)

    def model_card(self, name: str, *, created: int) -> dict[str, Any]:
        """One entry of /v1/models, with the window in the fields real servers use."""
        card: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "cadau-fake",
        }
        if self.context_window:
            card["max_model_len"] = self.context_window
            card["meta"] = {
                "n_ctx": self.context_window,
                "n_ctx_train": self.train_context_window or self.context_window,
            }
        return card


def default_reply(
    *,
    kind: str,
    messages: list[Message],
    max_tokens: int | None,
    reply_words: int | None,
    summary_style: str = "digest",
) -> ScriptedReply:
    if kind == "summary":
        cap = max_tokens * RUNES_PER_TOKEN if max_tokens else DEFAULT_SUMMARY_RUNES
        if summary_style != "digest":
            return ScriptedReply(
                content=summary_reply(style=summary_style, messages=messages, cap=cap)
            )
        asked = requested_max_runes(messages)
        cap = min(cap, asked) if asked else cap
        return ScriptedReply(content=extractive_summary(messages, max_runes=cap))
    last_user = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            last_user = " ".join(message_text(message).split())
            break
    text = f"Echo: {last_user}"
    if reply_words:
        words = text.split()
        filler = (f"w{i}" for i in range(reply_words))
        text = " ".join((words + list(filler))[:reply_words])
    return ScriptedReply(content=text)


def quoted_answer(*, messages: list[Message], quote: str) -> str:
    """What a model that read its prompt answers about `quote` (ScriptedReply.quote)."""
    last_user = max(
        (i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages)
    )
    needle = quote.casefold()
    for i, message in enumerate(messages):
        if i == last_user:
            continue
        for line in message_text(message).splitlines():
            if needle in line.casefold():
                return f"From earlier in our conversation: {line.strip()}"
    return "I do not know."


def estimate_prompt_tokens(messages: list[Message]) -> int:
    return max(1, sum(len(message_text(m)) for m in messages) // RUNES_PER_TOKEN)


def tool_calls_openai(reply: ScriptedReply, *, call_index: int) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(reply.tool_calls):
        args = call.get("arguments", "")
        out.append(
            {
                "id": str(call.get("id") or f"call_{call_index}_{i}"),
                "type": "function",
                "function": {
                    "name": str(call["name"]),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return out
