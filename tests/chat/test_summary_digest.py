"""The digest (chat/context/digest.py): an accepted summary that leaves room under its cap is
followed by the extractive fallback's sentences in that room; the model never sees them, the
guard does not hold the model to them, and they carry over from round to round. Through
summary_merge and the fake model server on loopback."""

from __future__ import annotations

import json

from cadau.contextconfig import ContextConfig
from chat import context as ctx
from chat.context.digest import DIGEST_MIN_RUNES, summary_split
from chat.context.guard import FALLBACK_MODEL
from chat.context.heading import DIGEST_SEPARATOR, summary_language
from chat.context.merge import summary_merge
from tests.fixtures_llm import summary_of

# The shipped budget: a 6,000-rune cap.
CFG = ContextConfig(input_budget_runes=48_000, summary_max_runes=6_000)
VAGUE = summary_of("The two friends caught up about their lives and plans.")
KICKBOXING = "I'm doing kickboxing three times a week at the Riverside gym."
DAUGHTER = "That picture was from a trip for my daughter Sara's birthday in May."


def tm(i: int, role: str, content: str) -> ctx.TailMessage:
    return ctx.TailMessage(
        id=i, role=role, content=content, tool_calls=None, tool_call_id="", runes=len(content)
    )


def _day(first: int, fact: str) -> list[ctx.TailMessage]:
    return [
        tm(first, "user", "Hey! Good to see you! How have you been?"),
        tm(first + 1, "assistant", f"Hi! Pretty busy, honestly. {fact}"),
        tm(first + 2, "user", "Haha, that sounds great. Talk soon!"),
    ]


def _summary_requests(fake_llm) -> list[str]:
    return [
        json.dumps(call.body["messages"], ensure_ascii=False)
        for call in fake_llm.calls
        if call.kind == "summary"
    ]


def test_a_short_summary_is_followed_by_the_facts_it_left_out(fake_llm):
    fake_llm.script_summary(VAGUE)
    merged = summary_merge(previous="", messages=_day(1, KICKBOXING), cfg=CFG)
    own, digest = summary_split(merged.summary)
    assert own == VAGUE and merged.model != FALLBACK_MODEL and not merged.problem
    assert KICKBOXING in digest
    assert merged.summary == f"{VAGUE}{DIGEST_SEPARATOR}{digest}"
    assert len(merged.summary) <= CFG.summary_cap_runes


def test_the_model_never_sees_the_digest_and_it_carries_over(fake_llm):
    fake_llm.script_summary(VAGUE, VAGUE)
    first = summary_merge(previous="", messages=_day(1, KICKBOXING), cfg=CFG).summary
    second = summary_merge(previous=first, messages=_day(10, DAUGHTER), cfg=CFG)
    request = _summary_requests(fake_llm)[-1]
    assert "caught up about their lives" in request  # the model's own summary, to merge into
    assert "Kept word for word" not in request and "kickboxing" not in request
    own, digest = summary_split(second.summary)
    assert own == VAGUE and second.model != FALLBACK_MODEL
    assert KICKBOXING in digest and DAUGHTER in digest
    assert digest.index("kickboxing") < digest.index("daughter")  # the older first


def test_the_guard_does_not_hold_the_model_to_the_digests_identifiers(fake_llm):
    """The digest names ACC-99812; the model's summary, which never saw it, does not: that is
    no identifier dropped (without the split, the answer was rejected and retried)."""
    fake_llm.script_summary(VAGUE, VAGUE)
    first = summary_merge(
        previous="", messages=_day(1, "My account is ACC-99812, opened in 2019."), cfg=CFG
    ).summary
    assert "ACC-99812" in summary_split(first)[1]
    second = summary_merge(previous=first, messages=_day(10, DAUGHTER), cfg=CFG)
    assert fake_llm.count("summary") == 2 and not second.problem
    assert "ACC-99812" in summary_split(second.summary)[1]


def test_a_sentence_the_summary_says_is_not_said_again(fake_llm):
    said = summary_of(KICKBOXING)
    fake_llm.script_summary(said)
    merged = summary_merge(previous="", messages=_day(1, f"{KICKBOXING} {DAUGHTER}"), cfg=CFG)
    assert merged.summary.count("kickboxing") == 1
    assert DAUGHTER in summary_split(merged.summary)[1]


def test_a_summary_that_leaves_too_little_room_has_no_digest(fake_llm):
    letters = "abcdefghijklmnopqrstuvwxyz"
    lines = [
        f"{a}{b}{c}ing {c}{a}{b}ed {b}{c}{a}er" for a in letters for b in letters for c in "ab"
    ]
    while (
        len(full := summary_of("\n- ".join(lines))) > CFG.summary_cap_runes - DIGEST_MIN_RUNES // 2
    ):
        lines.pop()
    fake_llm.script_summary(full)
    merged = summary_merge(previous="", messages=_day(1, KICKBOXING * 150), cfg=CFG)
    assert merged.summary == full and DIGEST_SEPARATOR not in merged.summary


def test_a_rejected_answer_falls_back_with_the_digests_facts(fake_llm):
    fake_llm.script_summary(VAGUE)
    first = summary_merge(previous="", messages=_day(1, KICKBOXING), cfg=CFG).summary
    fake_llm.script_summary("<think>hmm</think>", "<think>still thinking</think>")
    merged = summary_merge(previous=first, messages=_day(10, DAUGHTER), cfg=CFG)
    assert merged.model == FALLBACK_MODEL
    assert KICKBOXING in merged.summary and DAUGHTER in merged.summary
    assert DIGEST_SEPARATOR not in merged.summary


def test_small_talk_alone_adds_no_digest(fake_llm):
    fake_llm.script_summary(VAGUE)
    chat = [tm(1, "user", "Hey! How are you?"), tm(2, "assistant", "Good, thanks! You?")]
    merged = summary_merge(previous="", messages=chat, cfg=CFG)
    assert merged.summary == VAGUE


def test_the_digest_keeps_to_the_room_round_after_round(fake_llm):
    """Facts enough to fill the room many times over: the oldest stay, the cap holds."""
    fake_llm.script_summary(*[VAGUE] * 6)
    summary = ""
    for day in range(6):
        facts = " ".join(
            f"On day {day} I paid {day * 100 + n} euros for the ticket to Graz number {n}."
            for n in range(60)
        )
        summary = summary_merge(previous=summary, messages=_day(day * 10, facts), cfg=CFG).summary
        assert len(summary) <= CFG.summary_cap_runes
    own, digest = summary_split(summary)
    assert own == VAGUE and "On day 0 I paid" in digest and "On day 5 I paid" in digest


def test_the_separator_does_not_make_a_chinese_summary_english():
    # Seven Han characters against the separator's seven English words.
    summary = summary_of("聊了近况。") + DIGEST_SEPARATOR + "## Facts and decisions\n- 住北京。"
    assert summary_language(summary=summary) == "zh"
