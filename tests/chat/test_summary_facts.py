"""What a sentence carries (chat/context/facts.py): sentence ends in English and Chinese,
identifiers that are identifiers, weights by content, cuts that never split a word."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat.context.facts import (
    clause_cut,
    identifier_key,
    identifiers_find,
    sentence_kind,
    sentence_weight,
    sentences_split,
)


def test_sentences_end_at_english_and_chinese_terminators():
    assert sentences_split("Hey Mel! Good to see you! I live in Bratislava. We ship v2.3 now.") == [
        "Hey Mel!",
        "Good to see you!",
        "I live in Bratislava.",
        "We ship v2.3 now.",
    ]
    assert sentences_split("你好！我住在北京。我们的项目代码是4471-KX。对吗？好") == [
        "你好！",
        "我住在北京。",
        "我们的项目代码是4471-KX。",
        "对吗？",
        "好",
    ]
    # A line break ends a sentence; a decimal point or a version does not.
    assert sentences_split("Price is 3.5%\nthe host is db-7.internal") == [
        "Price is 3.5%",
        "the host is db-7.internal",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Our project code is 4471-KX.", ["4471-KX"]),
        ("We ship v2.3 on 2026-12-31.", ["v2.3", "2026-12-31"]),
        ("We met on 8 May 2023 and again on May 9, 2023.", ["8 May 2023", "May 9, 2023"]),
        ("Connect to 10.0.4.17:5432 as ACC-99812.", ["10.0.4.17:5432", "ACC-99812"]),
        ("It cost 3,000 dollars, 42s, 10GB.", ["3,000", "42s", "10GB"]),
        ("预算是 3000 元，截止 2026年12月31日。", ["3000 元", "2026年12月31日"]),
        (
            "See https://x.example/a/42 and /srv/app/run.py",
            ["https://x.example/a/42", "/srv/app/run.py"],
        ),
        # Capitalised words open sentences; they identify nothing. Nor do counts and ordinals.
        ("Hi! My name? What is it? I have 7 cats, the 1st is old, 第5个。", []),
    ],
)
def test_identifiers_are_identifiers(text, expected):
    assert identifiers_find(text) == expected


def test_identifier_keys_ignore_case_spaces_commas_and_dash_styles():
    assert identifier_key("KX–4471") == identifier_key("kx-4471")
    assert identifier_key("3,000") == identifier_key("3000")


@pytest.mark.parametrize(
    "small_talk",
    [
        "Hey Mel!",
        "Good to see you!",
        "Haha yes.",
        "Thanks so much!",
        "你好！",
        "哈哈",
        "What about you?",
    ],
)
def test_small_talk_weighs_nothing(small_talk):
    assert sentence_weight(small_talk) == 0


@pytest.mark.parametrize(
    "fact",
    [
        "I live in Bratislava.",
        "Our project code is 4471-KX.",
        "My favourite colour is green.",
        "Caroline adopted a dog named Rex last week.",
        "我住在北京。",
        "我们的项目代码是4471-KX。",
        "我最喜欢的颜色是绿色。",
    ],
)
def test_facts_weigh_more_than_small_talk(fact):
    assert sentence_weight(fact) >= 2


def test_sentences_are_filed_by_kind():
    assert sentence_kind("My favourite colour is green.") == "preference"
    assert sentence_kind("I need to renew the passport by Friday.") == "task"
    assert sentence_kind("I live in Bratislava.") == "fact"


def test_a_cut_falls_at_a_clause_or_word_boundary():
    sentence = "I live in Bratislava, in the old town near the castle with my two cats"
    cut = clause_cut(sentence, limit=30)
    assert cut == "I live in Bratislava…"
    assert (
        clause_cut("Bratislava is lovely in spring and autumn", limit=25)
        == "Bratislava is lovely in…"
    )
    assert clause_cut("我住在北京，在朝阳区的一个老小区里面", limit=10) == "我住在北京…"
    assert clause_cut("short", limit=30) == "short"


@hsettings(max_examples=80, deadline=None)
@given(
    words=st.lists(
        st.text(alphabet="abcdefghij", min_size=1, max_size=12), min_size=1, max_size=30
    ),
    limit=st.integers(min_value=5, max_value=120),
)
def test_a_cut_never_splits_a_word(words, limit):
    text = " ".join(words)
    cut = clause_cut(text, limit=limit)
    assert len(cut) <= limit
    kept = cut.removesuffix("…").split()
    # Every kept word is whole: the cut text is a prefix of the words.
    assert kept == words[: len(kept)]
