"""Concepts (chat/search/concepts.py): the kinds of thing a message names, spelled out from
WordNet, and recall finding the turns that name a member without the word itself."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search import archive_rows, archive_window
from chat.search.archive_window import ArchiveRow, archive_windows_forget
from chat.search.concepts import (
    KindTexts,
    concept_members,
    concepts_named,
    words_of,
)
from chat.search.recall_auto import EXCERPT_RUNES, recall_auto
from devtools.wordnet_build import graph_build
from tests.chat.recall_setup import recall_ask, recall_settings
from tests.factories import ChatSessionFactory, make_conversation


def test_a_category_spells_out_its_kinds_and_synonyms():
    assert {"taekwondo", "karate", "judo"} <= concept_members("martial arts")
    assert {"spain", "england", "france"} <= concept_members("European countries")
    assert "yoga" in concept_members("exercises")
    assert "kid" in concept_members("child")  # another name of the same sense
    # Irregular and regular plurals, as WordNet's morphy reads them.
    assert concept_members("children") == concept_members("child")
    assert concept_members("countries") == concept_members("country")
    # The word itself is no member: recall matches it as a term already.
    assert "child" not in concept_members("child")


def test_a_vague_concept_or_no_noun_expands_to_nothing():
    assert concept_members("activity") == frozenset()  # thousands of members
    assert KindTexts(["any text at all"]).naming("zyxwv") == {}
    assert concept_members("zyxwv") == frozenset()
    assert concept_members("") == frozenset()


def test_a_question_names_the_kind_it_asks_for():
    assert concepts_named("What martial arts has John done?") == ["martial arts"]
    assert concepts_named("What European countries has Maria been to?") == ["european countries"]
    assert concepts_named("How many children does Tim have?") == ["children"]
    assert concepts_named("What kinds of exercises did she do?") == ["exercises"]
    # A message that asks for no kind names none: its nouns are not expanded.
    assert concepts_named("Did my child mention the exercises?") == []
    assert concepts_named("ok, thanks!") == []
    # "John" is WordNet's word for a toilet: a capitalised word is a name, never expanded;
    # "is" is no kind ("Which city is...": the city has too many members).
    assert concepts_named("Which John is it?") == []
    assert concepts_named("Which city is John excited about?") == []
    asked = "What books? Which games? How many sports? What exercises? What martial arts?"
    assert concepts_named(asked) == ["books", "games", "sports"]
    # The next question word starts a question of its own.
    assert concepts_named("What books and which movies did she like?") == ["books", "movies"]
    # The frame of a question is no kind.
    assert concepts_named("Which one? What time? Which way?") == []


def _names(text: str, concept: str) -> bool:
    return bool(KindTexts([text]).naming(concept))


def test_a_member_with_punctuation_is_matched_as_a_whole_word():
    assert "s.u.v." in concept_members("cars")
    assert _names("we rented an s.u.v. yesterday", "cars")
    assert not _names("s.u.v.x", "cars")
    assert not _names("judoka", "martial arts")
    assert not _names("_judo", "martial arts")
    assert _names("judo!", "martial arts")


def test_each_member_named_with_the_texts_naming_it():
    texts = ["then tae kwon do, and judo", "judoka and taekwondoin", "judo again"]
    assert KindTexts(texts).naming("martial arts") == {"judo": [0, 2], "tae kwon do": [0]}


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(), max_size=4))
def test_the_words_of_texts_hold_every_ascii_run_of_word_characters(texts):
    runs = set(re.findall(r"\w+", "\n".join(texts)))
    assert {r for r in runs if r.isascii()} <= words_of(texts) <= runs


def test_the_words_of_texts_are_their_ascii_runs_of_word_characters():
    texts = ["Hello, wörld—again_1 s.u.v.", "日本語のテキスト «quoted» x\ty"]
    # A Chinese sentence is one run of \w, "wörld" another: no member is either.
    assert words_of(texts) == {"Hello", "again_1", "s", "u", "v", "quoted", "x", "y"}


def test_a_vague_kind_or_no_kind_expands_to_nothing():
    assert concept_members("knee") == frozenset()  # no hyponyms: not a kind of thing
    assert concept_members("music") == frozenset()  # more than MEMBERS_MAX


def test_a_long_message_is_read_for_its_beginning_only():
    assert concepts_named("zyxwv " * 500 + "What martial arts?") == []


_WORDS = ["spain", "spa", "spainx", "tae kwon do", "taekwondo", "tae", "kwon", "judo", "x"]
_GLUE = [" ", "", ", ", "_", ".", "—", "é", "\n"]


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5),
    glue=st.lists(st.sampled_from(_GLUE), min_size=5, max_size=5),
    cut=st.integers(0, 3),
)
def test_kinds_find_what_a_plain_alternation_finds(words, glue, cut):
    """The words read first, then the members looked for by substring: the same members as a
    regular expression of each, as a whole word."""
    text = "".join(w + g for w, g in zip(words, glue, strict=False))[cut:]
    for concept in ("martial arts", "european countries"):
        members = sorted(concept_members(concept), key=len, reverse=True)
        said = {m for m in members if re.search(r"(?<!\w)" + re.escape(m) + r"(?!\w)", text)}
        assert set(KindTexts([text]).naming(concept)) == said


def test_the_graph_is_built_from_wordnets_files(tmp_path):
    """devtools/wordnet_build.py on a three-synset WordNet: lemmas, the most frequent sense
    (index.noun's first offset), hyponyms and instance hyponyms, irregular plurals."""
    licence = "  1 This software and database is being provided to you\r\n"
    (tmp_path / "data.noun").write_text(
        licence
        + "00000001 03 n 02 martial_art 0 fighting_art 0 002 ~ 00000002 n 0000 ~i 00000003 n 0000"
        " | a fighting art\r\n"
        "00000002 04 n 01 judo 0 001 @ 00000001 n 0000 | a sport\r\n"
        "00000003 04 n 01 Taekwondo 0 001 @i 00000001 n 0000 | a sport\r\n"
    )
    (tmp_path / "index.noun").write_text(
        licence + "martial_art n 1 1 ~ 1 0 00000001\r\n"
        "fighting_art n 1 0 1 0 00000001\r\njudo n 1 0 1 0 00000002\r\n"
        "taekwondo n 1 0 1 0 00000003\r\n"
    )
    (tmp_path / "noun.exc").write_text("judoes judo\n")
    graph = graph_build(tmp_path)
    assert graph["lemmas"] == ["fighting art", "judo", "martial art", "taekwondo"]
    assert graph["synsets"] == [[2, 0], [1], [3]]
    assert graph["hyponyms"] == [[1, 2], [], []]
    assert graph["first"] == [0, 1, 0, 2]
    assert graph["exceptions"] == {"judoes": "judo"}


def _row(mid: int, text: str) -> ArchiveRow:
    return ArchiveRow(mid, MessageRole.USER, datetime.now(UTC), text, text.casefold())


def test_a_moved_window_carries_its_concepts_over():
    kept = archive_window._window(
        below_id=3,
        version=0,
        rows=[_row(2, "I did judo"), _row(1, "karate, hello")],
        more=False,
        size=2,
        read_at=0.0,
    )
    assert kept.naming("martial arts") == {"judo": (2,), "karate": (1,)}
    assert kept.naming("european countries") == {}
    added = [_row(4, "Karate now"), _row(3, "fine")]
    rows = [*added, *kept.rows][:2]
    texts = KindTexts([r.folded for r in added])
    carried = archive_rows.named_moved(kept, added=added, texts=texts, rows=rows)
    # The added row found, the fallen-off ones gone; a concept no row named stays kept empty.
    assert carried == {"martial arts": {"karate": (4,)}, "european countries": {}}


@pytest.mark.django_db(transaction=True)
def test_recall_finds_a_turn_that_names_a_member_and_not_the_word(owner, settings, tmp_path):
    """The question shares no word with the turn that answers it: without concepts recall
    finds nothing of it."""
    recall_settings(settings, tmp_path)
    archive_windows_forget()
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    answer = ChatMessage.objects.create(
        session=session,
        role=MessageRole.USER,
        content="Long day. " * 300 + "I'm off to do some taekwondo tonight!",
    )
    make_conversation(session, turns=30, words=12)
    anchor = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="anchor")
    session.verbatim_since_message_id = anchor.pk
    session.save()
    ask = recall_ask(session, "What martial arts have I done?", room=2000)
    recalled = recall_auto(ask)
    assert answer.pk in [r.id for r in recalled]
    # A long message found through a kind alone is cut around the member it says.
    (piece,) = [r for r in recalled if r.id == answer.pk]
    assert "taekwondo" in piece.content and len(piece.content) <= EXCERPT_RUNES
    # The same conversation asked about something no turn names: nothing of it comes back.
    unrelated = recall_auto(dataclasses.replace(ask, query="What pets have I had?"))
    assert answer.pk not in [r.id for r in unrelated]
