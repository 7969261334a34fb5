"""Thinking models' reasoning, kept out of reply text and summaries.

Two shapes reach us. DeepSeek, Qwen/DashScope and vLLM's reasoning parsers send it beside the
answer as `reasoning_content`, which the codec never reads as text. Servers without a parser
(llama.cpp with a Qwen3 or DeepSeek-R1 GGUF, Ollama's older builds) put it in the content,
wrapped in `<think>…</think>` before the answer: that is what `ThinkSplitter` takes out, on a
stream as it arrives and on a whole completion alike.

Only a block that opens the reply counts. A `<think>` tag in the middle of an answer is the
model writing about tags (or quoting HTML) and stays, so a user asking about the syntax gets it.
"""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


class ThinkSplitter:
    """Feeds text pieces in order; returns what the user may see of each piece.

    Holds back at most `len(OPEN)` characters at the start (until it knows whether the reply
    opens with a think block) and `len(CLOSE) - 1` inside a block (a closing tag split across
    chunks). `flush()` releases what is held at the end of the reply; an unclosed block (the
    model ran out of tokens while thinking) yields nothing visible.
    """

    __slots__ = ("_held", "_mode", "reasoning_runes")

    def __init__(self) -> None:
        # "start": nothing visible yet; "think": inside the opening block; "after": just past
        # the block (its trailing blank lines are dropped); "text": passing through.
        self._mode = "start"
        self._held = ""
        self.reasoning_runes = 0

    def feed(self, piece: str) -> str:
        if self._mode == "text":
            return piece  # the per-token path once the answer has begun: no copying
        self._held += piece
        return self._advance()

    def _advance(self) -> str:
        if self._mode == "start":
            stripped = self._held.lstrip()
            if stripped.startswith(OPEN):
                self._mode = "think"
                self._held = stripped[len(OPEN) :]
            elif OPEN.startswith(stripped):
                return ""  # whitespace or a prefix of the tag so far: wait for more
            else:
                self._mode = "text"
                visible, self._held = self._held, ""
                return visible
        if self._mode == "think":
            end = self._held.find(CLOSE)
            if end < 0:
                keep = len(CLOSE) - 1
                self.reasoning_runes += max(0, len(self._held) - keep)
                self._held = self._held[-keep:] if len(self._held) > keep else self._held
                return ""
            self.reasoning_runes += end
            self._held = self._held[end + len(CLOSE) :]
            self._mode = "after"
        if self._mode == "after":
            stripped = self._held.lstrip()
            if not stripped:
                self._held = ""
                return ""
            self._mode = "text"
            self._held = ""
            return stripped
        return ""

    def flush(self) -> str:
        """What is still held when the reply ends: a short reply that was only a prefix of the
        tag ("<th"), or nothing when the reply ended inside its think block."""
        held, self._held = self._held, ""
        if self._mode == "start":
            self._mode = "text"
            return held
        if self._mode == "think":
            self.reasoning_runes += len(held)
        return ""


def strip_think(text: str) -> str:
    """A whole completion's text without its opening think block."""
    splitter = ThinkSplitter()
    return splitter.feed(text) + splitter.flush()
