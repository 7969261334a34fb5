"""The OpenAI wire format of one completion, whole (JSON) or streamed (SSE), with the faults
that strike inside a response: cut, hang and error mid-stream, invalid JSON, no usage."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devtools.fakellm.scripts import (
    Call,
    Fault,
    ScriptedReply,
    error_body,
    in_stream_overflow_error,
    tokenize,
    tool_calls_openai,
)

if TYPE_CHECKING:
    from devtools.fakellm.handler import Handler
    from devtools.fakellm.pacer import Pacer


@dataclass(slots=True)
class Answer:
    """Everything one response needs, decided before the first byte is written."""

    call: Call
    reply: ScriptedReply
    fault: Fault | None
    #: The fault comes from the configured context window, not from fail_next.
    overflow: bool
    model: str
    prompt_tokens: int
    token_ms: float
    #: False when the server or the fault says: no usage in this response.
    usage: bool
    release: threading.Event
    #: Set when the server interrupts a stream for a waiting request: says whether one waits.
    someone_waiting: Callable[[], bool] | None = None

    @property
    def finish_reason(self) -> str:
        return self.reply.finish_reason or ("tool_calls" if self.reply.tool_calls else "stop")

    def usage_json(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def error_object(self) -> dict[str, Any]:
        """The `{"error": ...}` a stream_error fault sends."""
        if self.overflow:
            return in_stream_overflow_error()
        assert self.fault is not None
        message = self.fault.message or "injected in-stream error (fake LLM server)"
        return error_body(message, type_="server_error", code=self.fault.status)


def send_whole(out: Handler, answer: Answer) -> None:
    fault, reply = answer.fault, answer.reply
    kind = fault.kind if fault else None
    if kind == "invalid_json":
        out.send_raw(200, b'{"choices": [ {"message": nope', content_type="application/json")
        return
    if kind == "stream_error":
        # Not streaming, the error object is the whole body of a 200 (some proxies do this).
        out.send_json(200, answer.error_object())
        return
    tool_calls = tool_calls_openai(reply, call_index=answer.call.index)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    payload: dict[str, Any] = {
        "id": f"chatcmpl-fake-{answer.call.index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer.model,
        "choices": [{"index": 0, "message": message, "finish_reason": answer.finish_reason}],
    }
    if answer.usage:
        completion_tokens = len(tokenize(reply.reasoning + reply.content)) + len(tool_calls)
        payload["usage"] = answer.usage_json(completion_tokens)
    data = json.dumps(payload, ensure_ascii=False).encode()
    if kind == "cut":
        # Promise the whole body, deliver half, hang up: the client sees a short read.
        out.send_raw(
            200, data[: len(data) // 2], content_type="application/json", declared_length=len(data)
        )
        out.close_connection = True
        return
    out.send_raw(200, data, content_type="application/json")


def _pieces(answer: Answer) -> list[dict[str, Any]]:
    """The deltas of the reply, each written as one chunk at the token rate."""
    reply = answer.reply
    # DeepSeek and Qwen stream the reasoning first, content null, then the answer.
    pieces: list[dict[str, Any]] = [
        {"content": None, "reasoning_content": t} for t in tokenize(reply.reasoning)
    ]
    pieces += [{"content": t} for t in tokenize(reply.content)]
    for i, tc in enumerate(tool_calls_openai(reply, call_index=answer.call.index)):
        opening = {
            "index": i,
            "id": tc["id"],
            "type": "function",
            "function": {"name": tc["function"]["name"], "arguments": ""},
        }
        pieces.append({"tool_calls": [opening]})
        args = tc["function"]["arguments"]
        for start in range(0, len(args), 8):
            frag = args[start : start + 8]
            pieces.append({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})
    return pieces


def send_stream(out: Handler, answer: Answer, *, pacer: Pacer, include_usage: bool) -> None:
    out.start_event_stream()
    if _stream_broken_at_start(out, answer=answer):
        return
    pieces = _pieces(answer)
    stop_after = _fault_position(answer, pieces=len(pieces))
    out.event(_chunk(answer, {"role": "assistant", "content": ""}))
    waiting = answer.someone_waiting
    # The pacer writes a stream to its end; one that may be interrupted keeps its own loop.
    if stop_after is None and waiting is None and answer.token_ms > 0 and len(pieces) > 1:
        pacer.run(
            emit=lambda piece: out.event(_chunk(answer, piece)),
            pieces=pieces,
            interval=answer.token_ms / 1000,
        )
        pieces_left: list[dict[str, Any]] = []
    else:
        pieces_left = pieces
    for n, piece in enumerate([*pieces_left, None]):
        if stop_after is not None and n == stop_after and _fault_strike(out, answer=answer):
            return
        if piece is None:
            break
        if n and waiting is not None and waiting():
            # llama-cpp-python's interruption: a clean end, without a finish_reason.
            out.event("[DONE]")
            out.end_chunks()
            return
        if n and answer.token_ms > 0:
            time.sleep(answer.token_ms / 1000)
        out.event(_chunk(answer, piece))
    _stream_finish(out, answer=answer, pieces=len(pieces), include_usage=include_usage)


def _chunk(
    answer: Answer, delta: dict[str, Any], finish_reason: str | None = None
) -> dict[str, Any]:
    now = time.time()
    return {
        "id": f"chatcmpl-fake-{answer.call.index}",
        "object": "chat.completion.chunk",
        "created": int(now),
        "model": answer.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        "x_emit_ts": now,
    }


def _stream_broken_at_start(out: Handler, *, answer: Answer) -> bool:
    """Write the faults that break a stream before its first chunk; True if it was one."""
    kind = answer.fault.kind if answer.fault else None
    if kind == "overflow_cut":
        # What llama-cpp-python does with a prompt over n_ctx when streaming: the 200 and its
        # headers are out before the model looks at the prompt; then the body just ends.
        out.end_chunks()
        return True
    if kind == "invalid_json":
        out.chunk(b'data: {"choices": [{"delta": {"content": nope\n\n')
        out.end_chunks()
        return True
    return False


def _fault_position(answer: Answer, *, pieces: int) -> int | None:
    """Where a mid-stream fault strikes: a cut, a hang or an interruption only inside the reply
    (one placed past its end never strikes), an error at the latest after the last piece."""
    fault = answer.fault
    if fault is None or fault.after_tokens is None:
        return None
    if fault.kind in ("cut", "hang", "interrupted") and fault.after_tokens < pieces:
        return fault.after_tokens
    if fault.kind == "stream_error":
        return min(fault.after_tokens, pieces)
    return None


def _fault_strike(out: Handler, *, answer: Answer) -> bool:
    """Write the mid-stream fault; True if it ended the stream (a hang waits, then goes on)."""
    fault = answer.fault
    assert fault is not None
    if fault.kind == "cut":
        # No terminating chunk: the client sees the body end mid-stream.
        out.close_connection = True
        return True
    if fault.kind == "stream_error":
        # vLLM's shape: the error object as a data event, then [DONE].
        out.event(answer.error_object())
        out.event("[DONE]")
        out.end_chunks()
        return True
    if fault.kind == "interrupted":
        out.event("[DONE]")
        out.end_chunks()
        return True
    answer.release.wait(fault.seconds)
    return False


def _stream_finish(out: Handler, *, answer: Answer, pieces: int, include_usage: bool) -> None:
    """The final chunk with the finish_reason, the usage chunk when asked for, then [DONE]."""
    out.event(_chunk(answer, {}, finish_reason=answer.finish_reason))
    if include_usage and answer.usage:
        usage_chunk = _chunk(answer, {})
        usage_chunk["choices"] = []
        usage_chunk["usage"] = answer.usage_json(pieces)
        out.event(usage_chunk)
    out.event("[DONE]")
    out.end_chunks()
