"""Thinking models' reasoning never becomes reply text (chat/llm/reasoning.py, the codec)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat.llm.reasoning import ThinkSplitter, strip_think
from tests.llm.conftest import USER_HI, stream


def _split_feed(text: str, cuts: list[int]) -> str:
    splitter = ThinkSplitter()
    pieces, last = [], 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(text))):
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    return "".join(splitter.feed(p) for p in pieces) + splitter.flush()


@pytest.mark.parametrize(
    ("text", "visible"),
    [
        ("<think>\nplan\n</think>\n\nThe answer.", "The answer."),
        ("  \n<think>plan</think>Answer", "Answer"),
        ("<think>never closed, ran out of tokens", ""),
        ("No thinking here.", "No thinking here."),
        # A tag in the middle of an answer is the model writing about tags.
        ("Use <think> tags like <think>x</think>.", "Use <think> tags like <think>x</think>."),
        ("<th", "<th"),  # a reply too short to tell: released at the end
        ("", ""),
        ("<think></think>", ""),
    ],
)
def test_strip_think(text, visible):
    assert strip_think(text) == visible


@given(
    thought=st.text(max_size=40).filter(lambda t: "</think>" not in t),
    answer=st.text(max_size=40).filter(lambda a: a.strip() == a and a),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=12),
)
def test_any_chunking_gives_the_same_answer(thought, answer, cuts):
    text = f"<think>{thought}</think>\n{answer}"
    assert _split_feed(text, cuts) == answer
    plain = f"x{answer}"
    assert _split_feed(plain, cuts) == plain


def test_streamed_think_block_is_neither_sent_nor_kept(fake_llm, provider, mode):
    fake_llm.configure(token_ms=0)
    fake_llm.fail_next("think_tags", message="I should greet them politely first.")
    fake_llm.script("Hello there.")
    events = stream(provider, mode, messages=USER_HI)
    deltas = "".join(e.text for e in events if e.kind == "delta")
    assert deltas == "Hello there."
    assert events[-1].text == "Hello there."


def test_whole_completion_drops_the_think_block(fake_llm, provider):
    fake_llm.fail_next("think_tags", message="hmm")
    fake_llm.script("The answer.")
    assert provider.complete(messages=USER_HI).text == "The answer."


def test_reasoning_content_is_not_text(fake_llm, provider, mode):
    fake_llm.script({"content": "Paris.", "reasoning": "The capital of France is Paris"})
    events = stream(provider, mode, messages=USER_HI)
    assert "".join(e.text for e in events if e.kind == "delta") == "Paris."
    assert events[-1].text == "Paris."
