"""The summary guard and the extractive fallback against a real small model (llama-cpp-python
serving SmolLM2-135M at n_ctx 1024: tests/fixtures_real_llm.py), at the budgets issue 25 tried
(1,500 and 6,000 runes), in English and Chinese.

A 135M model's summaries vary from run to run, so these tests do not pin what it writes: they
pin what Cadau does with whatever it writes. The guard's verdict agrees with what the answer
visibly is (an invented identifier, a copied `[#id role]` label, missing headings are never
accepted), and a merge always ends in a summary within its cap that invents nothing and keeps
the project code, whether the model's answer or the fallback wrote it."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from cadau.contextconfig import ContextConfig
from chat import context as ctx
from chat.context.facts import identifier_key, identifiers_find
from chat.context.fallback import summary_extractive
from chat.context.guard import (
    FALLBACK_MODEL,
    SUMMARY_HEADINGS,
    summary_headings,
    summary_problem,
)
from chat.context.merge import SUMMARY_SYSTEM_PROMPT, _request, summary_merge
from chat.context.summarise import summarise_call, transcript_render, transcript_text
from chat.models import ChatMessage, MessageRole
from tests.factories import ChatSessionFactory
from tests.fixtures_real_llm import RealLLM

pytestmark = pytest.mark.real_llm

logger = logging.getLogger(__name__)

EN = [
    ("user", "Hey Mel! Good to see you! I live in Bratislava, in the old town near the castle."),
    ("assistant", "Hi! Great to see you too. How is the project going?"),
    ("user", "Our project code is 4471-KX and we release v2.3 on 2026-12-31."),
    ("assistant", "Nice! Congratulations on the release date."),
    ("user", "My favourite tea is sencha. Please remind me to book the venue."),
    ("assistant", "Sure, I will remind you about the venue."),
]
ZH = [
    ("user", "你好！我住在布拉迪斯拉发。"),
    ("assistant", "你好！项目进展如何？"),
    ("user", "我们的项目代码是4471-KX，版本v2.3在2026-12-31发布。"),
    ("assistant", "太好了！祝发布顺利。"),
]


def _budget(runes: int) -> ContextConfig:
    # The summary's cap scaled to the budget, as a small budget would set it; the window is
    # the server's, so the answer is bounded by the room the window leaves.
    return ContextConfig(
        input_budget_runes=runes,
        summary_max_runes=max(200, runes // 4),
        min_verbatim=2,
        window_tokens=1024,
    )


def _messages(chat: list[tuple[str, str]], *, first_id: int = 1) -> list[ctx.TailMessage]:
    return [
        ctx.TailMessage(
            id=first_id + i,
            role=role,
            content=text,
            tool_calls=None,
            tool_call_id="",
            runes=len(text),
        )
        for i, (role, text) in enumerate(chat)
    ]


def _invented(summary: str, *, material: str) -> list[str]:
    given = identifier_key(material)
    return [i for i in identifiers_find(summary) if identifier_key(i) not in given]


@pytest.mark.parametrize("budget", [1500, 6000])
@pytest.mark.parametrize("chat", [EN, ZH], ids=["en", "zh"])
def test_the_guard_never_accepts_what_the_model_visibly_got_wrong(real_llm: RealLLM, budget, chat):
    """The model's raw answer, judged: whatever it wrote, an answer with a made-up
    identifier, a copied transcript label or without the five headings is refused."""
    cfg = _budget(budget)
    messages = _messages(chat)
    material = transcript_render(messages)
    user = _request(previous="", messages=messages, cap=cfg.summary_max_runes, instructions="")
    answer = summarise_call(
        instructions=SUMMARY_SYSTEM_PROMPT, content=user, max_tokens=256, temperature=0.7
    ).text.strip()
    assert answer  # the server answered: the guard judged something real
    problem = summary_problem(
        text=answer, previous="", replaced_runes=len(material), material=material
    )
    visibly_wrong = (
        _invented(answer, material=material)
        or "[#" in answer
        or summary_headings(answer) != set(SUMMARY_HEADINGS)
    )
    if visibly_wrong:
        assert problem is not None, answer
    logger.warning("real_llm guard budget=%d problem=%s answer=%r", budget, problem, answer[:160])


# Each merge is up to three calls of 20-60 s on a shared CPU: two cases cover both budgets
# and both languages.
@pytest.mark.parametrize(("budget", "chat"), [(1500, EN), (6000, ZH)], ids=["1500-en", "6000-zh"])
def test_a_merge_keeps_the_facts_whoever_writes_it(real_llm: RealLLM, budget, chat):
    cfg = _budget(budget)
    first = _messages(chat[:3])
    previous = summary_extractive(previous="", messages=first, max_runes=cfg.summary_max_runes)
    assert "4471-KX" in previous
    later = _messages(chat[3:], first_id=10)
    merged = summary_merge(previous=previous, messages=later, cfg=cfg)
    material = f"{previous}\n{transcript_render(later)}"
    summary = merged.summary
    logger.warning(
        "real_llm merge budget=%d model=%s runes=%d problem=%s",
        budget,
        merged.model,
        len(summary),
        merged.problem,
    )
    assert 0 < len(summary) <= cfg.summary_max_runes
    assert "4471-KX" in summary, summary
    assert _invented(summary, material=material) == [], summary
    assert "[#" not in summary and "Existing summary" not in summary
    if merged.model != FALLBACK_MODEL:
        assert merged.problem == ""
        assert summary_headings(summary) == set(SUMMARY_HEADINGS)


@pytest.mark.django_db
def test_compactions_at_1500_runes_commit_every_time_and_keep_the_code(real_llm: RealLLM, settings):
    """Two compactions of a session on a 1,500-rune budget, English and Chinese turns:
    every one commits (the model's summary or the fallback, never a thrown-away compaction),
    and the project code said first is in every summary."""
    settings.CHAT_CONTEXT = dataclasses.replace(_budget(1500), threshold_pct=80, target_pct=50)
    session = ChatSessionFactory.create()
    turns = [*EN, *ZH, *EN[3:], *ZH[1:]]
    for round_ in range(2):
        for role, text in turns if round_ == 0 else [*turns[-4:], *EN[:2]]:
            ChatMessage.objects.create(
                session=session,
                role=MessageRole.USER if role == "user" else MessageRole.ASSISTANT,
                content=text if round_ == 0 else f"{text} ({round_})",
            )
        result = ctx.context_compact(session_id=session.pk, trigger="manual", force=True)
        session.refresh_from_db()
        logger.warning(
            "real_llm compaction round=%d outcome=%s calls=%d runes=%d",
            round_,
            result.outcome,
            result.llm_calls,
            len(session.context_summary),
        )
        assert result.outcome in ("committed", "skipped"), result
        if round_ == 0:
            assert result.outcome == "committed", result
        assert "4471-KX" in session.context_summary, session.context_summary
        assert len(session.context_summary) <= settings.CHAT_CONTEXT.summary_max_runes
        history = "\n".join(transcript_text(m) for m in ChatMessage.objects.filter(session=session))
        assert _invented(session.context_summary, material=history) == []
