"""The fake server's summary styles (devtools/fakellm/summaries.py) and the control API a driver
in another process uses: per-call scripts that replace the queue, calls after a given one,
without bodies, with their payload's runes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from chat.context.guard import SUMMARY_HEADINGS, summary_problem
from chat.context.merge import SUMMARY_SYSTEM_PROMPT, _request
from chat.llm.base import LLMError
from devtools.fakellm.summaries import VAGUE_TEXT, good_summary
from tests.llm.conftest import USER_HI


@dataclass(frozen=True, slots=True)
class _Said:
    id: int
    role: str
    content: str
    tool_calls: Any = None


def _summary_call(
    transcript: list[tuple[int, str, str]], *, previous: str = "", cap: int = 600
) -> list[dict[str, Any]]:
    """A summary request as Cadau's merge writes it, read only through its text."""
    lines = "\n\n".join(f"[#{i} {role}] {text}" for i, role, text in transcript)
    user = (
        f"Existing summary (may be empty):\n{previous or '(none)'}\n\n"
        f"New transcript excerpt:\n{lines}\n\n"
        f"Return the merged summary in at most {cap} characters."
    )
    return [{"role": "system", "content": SUMMARY_SYSTEM_PROMPT}, {"role": "user", "content": user}]


TRANSCRIPT = [
    (1, "user", "Hey! Good to see you. How are you?"),
    (2, "assistant", "Great, thanks. I moved to Porto on 3 May and started at Nimbus Labs."),
    (3, "user", "Nice! My sister Ines visits me in Lisbon every August."),
    (4, "assistant", "Lovely. Anything else?"),
    (5, "user", "I run 10 km every Sunday before breakfast."),
]


def test_good_summaries_keep_the_facts_under_the_headings_within_the_ask():
    messages = _summary_call(TRANSCRIPT)
    text = good_summary(messages, cap=600)
    assert "I moved to Porto on 3 May and started at Nimbus Labs." in text
    assert "My sister Ines visits me in Lisbon every August." in text
    assert "I run 10 km every Sunday before breakfast." in text
    assert "How are you?" not in text and "[#" not in text
    assert [h for h in SUMMARY_HEADINGS if f"## {h}" in text] == list(SUMMARY_HEADINGS)
    assert summary_problem(text=text, previous="", replaced_runes=2000) is None
    # The previous summary's items stay; under a tight ask the most informative go first.
    again = good_summary(_summary_call(TRANSCRIPT[:2], previous=text, cap=4000), cap=4000)
    assert "My sister Ines visits me in Lisbon every August." in again
    tight = good_summary(messages, cap=270)
    assert len(tight) <= 270
    assert "I moved to Porto on 3 May and started at Nimbus Labs." in tight


def test_the_styles_over_http(fake_llm, provider):
    messages = _summary_call(TRANSCRIPT)
    fake_llm.configure(summary_style="vague")
    vague = provider.complete(messages=messages).text
    assert VAGUE_TEXT in vague and "Porto" not in vague
    assert summary_problem(text=vague, previous="## Open tasks\n- x", replaced_runes=5000) is None
    fake_llm.configure(summary_style="unusable")
    unusable = provider.complete(messages=messages).text
    assert summary_problem(text=unusable, previous="", replaced_runes=len(unusable)) is not None
    fake_llm.configure(summary_style="good")
    assert "Nimbus Labs" in provider.complete(messages=messages).text
    # A chat call is not a summary call: it still echoes.
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")
    fake_llm.configure(summary_style="fail")
    with pytest.raises(LLMError):
        provider.complete(messages=messages)
    # A scripted summary still comes first.
    fake_llm.script_summary("scripted")
    assert provider.complete(messages=messages).text == "scripted"
    with pytest.raises(ValueError):
        fake_llm.configure(summary_style="brilliant")


def test_a_driver_scripts_each_call_and_reads_only_the_new_ones(fake_llm, provider):
    control = f"{fake_llm.url}/_control"
    httpx.post(f"{control}/script", json={"replies": ["stale", "stale too"]}).raise_for_status()
    httpx.post(f"{control}/script", json={"replies": ["fresh"], "replace": True})
    assert provider.complete(messages=USER_HI).text == "fresh"
    assert provider.complete(messages=USER_HI).text.startswith("Echo:")
    provider.complete(messages=_summary_call(TRANSCRIPT))
    listed = httpx.get(f"{control}/calls", params={"since": 2, "bodies": "0"}).json()
    assert (listed["total"], listed["chat"], listed["summary"]) == (3, 2, 1)
    [call] = listed["calls"]
    assert call["index"] == 3 and call["kind"] == "summary" and "body" not in call
    runes = sum(len(m["content"]) for m in _summary_call(TRANSCRIPT))
    assert call["prompt_runes"] == runes
    whole = httpx.get(f"{control}/calls", params={"since": 0}).json()["calls"]
    assert len(whole) == 3 and whole[0]["body"]["messages"] == USER_HI
    assert whole[0]["prompt_runes"] == sum(len(m["content"]) for m in USER_HI)
    assert httpx.get(f"{control}/calls", params={"since": "x"}).status_code == 400


def test_the_request_the_fake_reads_is_the_one_merge_writes():
    # The fake reads the scaffold lines Cadau writes; if their wording changes, this fails first.
    said = [_Said(id=i, role=role, content=text) for i, role, text in TRANSCRIPT]
    user = _request(previous="", messages=said, cap=600, instructions="")
    ours = _summary_call(TRANSCRIPT)[1]["content"]
    assert user == ours
