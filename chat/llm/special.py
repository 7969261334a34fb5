"""Chat-template control tokens in the text we send a model, made inert.

A model server renders the messages through the model's chat template and tokenizes the result
with its special tokens recognised (llama.cpp, vLLM, Ollama do): a user message, a recalled
memory, a web page a tool fetched or a summary holding `<|im_end|>\\n<|im_start|>system` closes
its own turn and opens one of a role it does not have. Every text of every message therefore
passes through `messages_neutralised` once, where the request body is built (chat/llm/codec.py),
whatever produced it. A ZERO WIDTH JOINER goes inside each marker (`<\u200d|im_start|>`): the
text reads the same to a person and to the model, but no tokenizer matches it as the special
token. What is stored is never changed."""

from __future__ import annotations

import re
from typing import Any

from chat.llm.base import Message

ZWJ = "\u200d"

# Families of control markers, by template:
# - `<|...|>`: ChatML (Qwen, Yi: <|im_start|>, <|im_end|>, <|endoftext|>), Llama 3
#   (<|begin_of_text|>, <|start_header_id|>, <|eot_id|>, <|python_tag|>), Phi (<|user|>,
#   <|end|>), GPT-style fill-in-the-middle (<|fim_prefix|>); DeepSeek writes the bars full-width
#   (<｜User｜>, <｜end▁of▁sentence｜>).
# - Llama 2 / Mistral: <s>, </s>, [INST], [/INST], <<SYS>>, <</SYS>>, [TOOL_CALLS],
#   [AVAILABLE_TOOLS], [TOOL_RESULTS], [SYSTEM_PROMPT] and their closing forms.
# - Gemma: <bos>, <eos>, <start_of_turn>, <end_of_turn>; Qwen's tool markup <tool_call>,
#   <tool_response>.
_SPECIAL = re.compile(
    r"<[|｜][^<>|｜\n]{1,64}[|｜]>"
    r"|</?s>|<</?SYS>>"
    r"|\[/?(?:INST|TOOL_CALLS|AVAILABLE_TOOLS|TOOL_RESULTS|SYSTEM_PROMPT|TOOL_CONTENT)\]"
    r"|</?(?:bos|eos|pad|unk|start_of_turn|end_of_turn|tool_call|tool_response)>"
)
# Every marker starts with one of these: text without them is returned untouched, unscanned.
_OPENERS = ("<", "[")


def text_neutralised(text: str) -> str:
    """`text` with a ZERO WIDTH JOINER after the first character of each control marker."""
    if not any(opener in text for opener in _OPENERS):
        return text
    return _SPECIAL.sub(lambda m: m.group(0)[0] + ZWJ + m.group(0)[1:], text)


def _content_neutralised(content: Any) -> Any:
    if isinstance(content, str):
        return text_neutralised(content)
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return [
            {**part, "text": text_neutralised(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def _call_neutralised(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    texts = {
        key: text_neutralised(value)
        for key in ("name", "arguments")
        if isinstance(value := function.get(key), str)
    }
    return {**call, "function": {**function, **texts}}


def messages_neutralised(messages: list[Message]) -> list[Message]:
    """Copies of `messages` whose texts (content, a tool call's name and arguments, a
    participant's name) carry no control marker; the originals are left as they are."""
    out: list[Message] = []
    for message in messages:
        copy = dict(message)
        if "content" in copy:
            copy["content"] = _content_neutralised(copy["content"])
        if isinstance(copy.get("name"), str):
            copy["name"] = text_neutralised(copy["name"])
        if isinstance(copy.get("tool_calls"), list):
            copy["tool_calls"] = [_call_neutralised(call) for call in copy["tool_calls"]]
        out.append(copy)
    return out
