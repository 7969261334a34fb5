"""The extractive fallback (chat/context/fallback.py): the summary written without a model keeps
facts, not first sentences; carries its own bullets over verbatim; cuts only at sentence,
clause or word ends; lists identifiers that are identifiers; and keeps the oldest facts
through many rounds, in English and in Chinese, at small and large caps."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat import context as ctx
from chat.context.facts import sentences_split
from chat.context.fallback import summary_extractive
from chat.context.guard import SUMMARY_HEADINGS, summary_headings

# A LoCoMo-like day of chat: mostly small talk, a fact or two.
EN_DAY = [
    ("user", "Hey Mel! Good to see you! How have you been?"),
    ("assistant", "Hi Caroline! Great to see you too. Pretty busy, honestly."),
    ("user", "Haha same. Work has been crazy this week."),
    ("assistant", "Oh no! Hope it calms down soon."),
    ("user", "Thanks! What did you do on the weekend?"),
    ("assistant", "Nothing much, just relaxed. You?"),
]
ZH_DAY = [
    ("user", "你好！好久不见！最近怎么样？"),
    ("assistant", "嗨！还不错，就是有点忙。"),
    ("user", "哈哈，我也是。这周工作特别多。"),
    ("assistant", "辛苦了！希望下周轻松一点。"),
]
EN_FIRST = (
    "Hey Mel! Good to see you! I live in Bratislava, in the old town near the castle. "
    "Our project code is 4471-KX."
)
ZH_FIRST = "你好！我住在布拉迪斯拉发。我们的项目代码是4471-KX。"


def tm(i: int, role: str, content: str) -> ctx.TailMessage:
    return ctx.TailMessage(
        id=i, role=role, content=content, tool_calls=None, tool_call_id="", runes=len(content)
    )


def _round(day: int, chat: list[tuple[str, str]], first: str) -> list[ctx.TailMessage]:
    """One compaction's chunk: the day's small talk, one new fact a day, `first` on day 0."""
    base = day * 100
    rows = [tm(base, "user", first)] if day == 0 else []
    rows += [tm(base + 1 + i, role, text) for i, (role, text) in enumerate(chat)]
    fact = (
        f"我第{day}次去了市场，买了{day + 12}个苹果。"
        if chat is ZH_DAY
        else f"On day {day} I bought {day + 12} apples at the market in Trnava."
    )
    rows.append(tm(base + 99, "user", fact))
    return rows


def _bullets(summary: str) -> list[str]:
    return [line[2:] for line in summary.splitlines() if line.startswith("- ")]


def _check_shape(summary: str, *, cap: int) -> None:
    assert len(summary) <= cap
    for bullet in _bullets(summary.split("## Exact identifiers")[0]):
        assert not re.match(r"(user|assistant): (user|assistant):", bullet), bullet
        assert "[" not in bullet, bullet  # nothing bracketed, no transcript labels
        text = re.sub(r"^(user|assistant): ", "", bullet)
        if bullet.startswith("- ") or text.startswith(("Hey", "Hi ", "Haha", "Thanks", "你好")):
            pytest.fail(f"small talk kept: {bullet!r}")
        for sentence in sentences_split(text):
            # Whole sentences, or cut at a word boundary with "…": never "Bratislava, i…".
            assert re.search(r"[.!?。！？…]$|\d$|[A-Za-z]{3,}$", sentence), sentence
            assert not re.search(r"\b\w{1,2}…$", sentence), sentence


def test_facts_are_kept_not_first_sentences():
    messages = [tm(1, "user", EN_FIRST)] + [
        tm(i + 2, role, text) for i, (role, text) in enumerate(EN_DAY)
    ]
    summary = summary_extractive(previous="", messages=messages, max_runes=1500)
    assert "I live in Bratislava, in the old town near the castle." in summary
    assert "4471-KX" in summary
    for small_talk in ("Hey Mel!", "Good to see you!", "Haha same.", "Oh no!"):
        assert small_talk not in summary
    assert summary_headings(summary) == set(SUMMARY_HEADINGS)
    _check_shape(summary, cap=1500)


def test_identifiers_listed_are_identifiers():
    messages = [
        tm(1, "user", "Hi! My name is Ana. What is new? We released v2.3 on 2026-12-31."),
        tm(2, "assistant", "What a day. The build id is BX-7781 and the port is 8443."),
    ]
    # Too small for both sentences: the identifiers of the one left out are listed.
    summary = summary_extractive(previous="", messages=messages, max_runes=130)
    assert "## Exact identifiers" in summary, summary
    listed = summary.split("## Exact identifiers")[-1]
    for word in ("Hi", "My", "What", "Ana"):
        assert not re.search(rf"\b{word}\b", listed), listed
    for identifier in ("v2.3", "2026-12-31", "BX-7781", "8443"):
        assert identifier in summary, summary


def test_its_own_bullets_are_carried_over_verbatim():
    first = summary_extractive(
        previous="",
        messages=[tm(1, "user", EN_FIRST), tm(2, "user", "My favourite tea is sencha.")],
        max_runes=1500,
    )
    second = summary_extractive(
        previous=first, messages=[tm(3, "assistant", "Okay!")], max_runes=1500
    )
    assert second == first  # nothing new worth keeping: the summary is unchanged, not re-cut
    third = summary_extractive(
        previous=second,
        messages=[tm(4, "user", "I moved to Vienna in March 2024.")],
        max_runes=1500,
    )
    for bullet in _bullets(first):
        assert bullet in third
    assert "I moved to Vienna in March 2024." in third


def test_a_model_summary_is_carried_under_its_sections():
    previous = (
        "## Facts and decisions\n- The user lives in Bratislava.\n"
        "## Open tasks\n- Book the hotel.\n"
        "## User constraints and preferences\n- Answers in Slovak.\n## Pending questions\n"
        "- (none recorded)\n## Exact identifiers\n- 4471-KX; /srv/app"
    )
    summary = summary_extractive(previous=previous, messages=[tm(1, "user", "Ok.")], max_runes=800)
    facts, rest = summary.split("## Open tasks")
    assert "- The user lives in Bratislava." in facts
    assert "- Book the hotel." in rest.split("## User constraints")[0]
    assert "- Answers in Slovak." in rest
    assert "4471-KX" in summary and "/srv/app" in summary
    assert "(none recorded)" not in summary


@pytest.mark.parametrize("cap", [300, 600, 1500, 6000])
@pytest.mark.parametrize(("chat", "first"), [(EN_DAY, EN_FIRST), (ZH_DAY, ZH_FIRST)])
def test_an_early_fact_survives_many_rounds(cap, chat, first):
    summary = ""
    for day in range(25):
        summary = summary_extractive(
            previous=summary, messages=_round(day, chat, first), max_runes=cap
        )
        _check_shape(summary, cap=cap)
        assert "4471-KX" in summary, (day, summary)
        if cap >= 600:
            assert "Bratislava" in summary or "布拉迪斯拉发" in summary, (day, summary)
    # The newest day's fact is in too: a summary full of old facts still takes new ones.
    assert "36" in summary or "36个" in summary, summary
    if cap >= 6000:
        # Room for every day's fact: none is lost along the way.
        assert all(str(day + 12) in summary for day in range(25)), summary


def test_small_caps_leave_out_empty_sections_but_keep_the_facts():
    summary = summary_extractive(previous="", messages=[tm(1, "user", EN_FIRST)], max_runes=200)
    assert len(summary) <= 200
    assert "4471-KX" in summary and "Bratislava" in summary
    assert "## Open tasks" not in summary


@hsettings(max_examples=60, deadline=None)
@given(
    contents=st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=10),
    previous=st.text(max_size=400),
    cap=st.integers(min_value=0, max_value=700),
)
def test_never_over_the_cap(contents, previous, cap):
    messages = [tm(i, "user" if i % 2 else "assistant", c) for i, c in enumerate(contents)]
    summary = summary_extractive(previous=previous, messages=messages, max_runes=cap)
    assert len(summary) <= cap
    assert summary == summary_extractive(previous=previous, messages=messages, max_runes=cap)
