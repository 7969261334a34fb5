"""A kept window's word list (chat/search/window_words.py): it finds exactly the rows a scan of
the window's rows finds, before and after the window moves; it is built on the warming thread,
never while a send is on its way, and kept only for the window it was built from."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat import workers
from chat.models import ChatMessage, MessageRole
from chat.search import archive_window
from chat.search.archive_window import ArchiveRow, archive_window_read, archive_window_words_build
from chat.search.window_words import EXTRA_ROWS_MAX, window_words_build
from tests.factories import ChatSessionFactory, make_conversation

_ALPHABET = st.sampled_from("aAbß é.-_:#,!?密码\n\t\u2028\x1c\u3000 İ\x85\xa0\u200b")


def _rows(texts: list[str], *, first_id: int = 1) -> list[ArchiveRow]:
    """Newest first, ids from `first_id` up in the order of `texts`."""
    rows = [
        ArchiveRow(first_id + i, MessageRole.USER, datetime.now(UTC), t, t.casefold())
        for i, t in enumerate(texts)
    ]
    return rows[::-1]


def _scan(rows: list[ArchiveRow], term: str) -> tuple[int, ...]:
    return tuple(r.id for r in rows if term in r.folded)


@given(
    texts=st.lists(st.text(_ALPHABET, max_size=24), min_size=1, max_size=10),
    gained=st.lists(st.text(_ALPHABET, max_size=24), max_size=4),
    cut=st.integers(0, 13),
    picks=st.lists(
        st.tuples(st.integers(0, 13), st.integers(0, 23), st.integers(1, 6)), max_size=4
    ),
    extra=st.text(_ALPHABET, min_size=1, max_size=4),
)
def test_the_word_list_finds_what_a_scan_of_the_rows_finds(texts, gained, cut, picks, extra):
    rows = _rows(texts)
    words = window_words_build(rows=rows)
    added = _rows(gained, first_id=len(texts) + 1)
    moved = words.gained(added)
    assert moved is not None
    # The moved window: the rows it gained and its old ones, down to its new oldest (a window of
    # long messages may keep fewer than it gained).
    oldest = min(cut + 1, len(texts) + len(gained))
    window = [r for r in (*added, *rows) if r.id >= oldest]
    every = [*texts, *gained]
    terms = [extra.casefold()] + [
        every[i % len(every)].casefold()[start : start + n] for i, start, n in picks
    ]
    for term in terms:
        if not term or any(c.isspace() for c in term):
            assert words.find(term, oldest=1) is None  # a phrase: the rows are scanned
            continue
        assert words.find(term, oldest=1) == _scan(rows, term), term
        assert moved.find(term, oldest=oldest) == _scan(window, term), term


def test_a_term_in_too_many_words_is_left_to_the_rows():
    texts = [" ".join(f"abc{i}" for i in range(start, start + 100)) for start in (0, 100, 200)]
    rows = _rows(texts)
    words = window_words_build(rows=rows)
    assert words.find("abc", oldest=1) is None  # 300 words: testing 3 rows is cheaper
    assert words.find("abc25", oldest=1) == _scan(rows, "abc25")
    window = archive_window._window(
        below_id=4, version=0, rows=rows, more=False, size=9, read_at=0.0, word_rows=words
    )
    assert window.containing("abc") == (3, 2, 1)


def test_a_list_that_gained_too_many_rows_is_dropped():
    words = window_words_build(rows=_rows(["alpha beta"]))
    assert words.gained(_rows(["gamma"] * EXTRA_ROWS_MAX, first_id=2)) is not None
    assert words.gained(_rows(["gamma"] * (EXTRA_ROWS_MAX + 1), first_id=2)) is None


pytestmark_db = pytest.mark.django_db


def _window(session, *, below_id: int, size: int = 10):
    return archive_window_read(
        owner_id=session.owner_id,
        session_id=session.pk,
        below_id=below_id,
        size=size,
        version=session.messages_version,
    )


@pytestmark_db
def test_a_window_read_gets_its_word_list_and_finds_the_same_rows_with_it(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    first = _window(session, below_id=ids[-1] + 1)
    assert first.word_rows is None  # never on a send's way
    assert archive_window_words_build(owner_id=owner.pk, session_id=session.pk)
    assert not archive_window_words_build(owner_id=owner.pk, session_id=session.pk)  # built
    kept = _window(session, below_id=ids[-1] + 1)
    assert kept.word_rows is not None and kept.rows == first.rows
    for term in ("question", "answer 1", "1", "question 12", "zebra", "answer"):
        assert kept.containing(term) == _scan(kept.rows, term), term
    # Moved: the rows it gained are tested one by one, those fallen off its end left out.
    said = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="A zebra")
    moved = _window(session, below_id=said.pk + 1)
    assert moved.word_rows is not None and moved.word_rows.extra == ((said.pk, "a zebra"),)
    assert ids[30] in {r.id for r in kept.rows} and ids[30] not in {r.id for r in moved.rows}
    for term in ("zebra", "question", "answer", "1"):
        assert moved.containing(term) == _scan(moved.rows, term), term


@pytestmark_db
def test_a_list_built_for_a_window_replaced_meanwhile_is_not_kept(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=10)]
    with pytest.MonkeyPatch.context() as patch:
        _window(session, below_id=ids[10])
        kept = archive_window._windows[(owner.pk, session.pk)]
        real = archive_window.window_words_build

        def build_then_replaced(*, rows):
            built = real(rows=rows)
            archive_window._keep((owner.pk, session.pk), archive_window._window(
                below_id=kept.below_id, version=kept.version, rows=kept.rows, more=kept.more,
                size=kept.size, read_at=kept.read_at,
            ))  # fmt: skip
            return built

        patch.setattr(archive_window, "window_words_build", build_then_replaced)
        assert not archive_window_words_build(owner_id=owner.pk, session_id=session.pk)
        assert archive_window._windows[(owner.pk, session.pk)].word_rows is None
        patch.setattr(archive_window, "window_words_build", real)
        runes = archive_window._kept_runes
        assert archive_window_words_build(owner_id=owner.pk, session_id=session.pk)
        listed = archive_window._windows[(owner.pk, session.pk)]
        assert listed.word_rows is not None
        # Counted against the cache's bound.
        assert archive_window._kept_runes == runes + listed.word_rows.runes


@pytestmark_db
def test_a_window_near_its_bound_is_kept_without_a_list_and_the_cache_stays_bounded(
    owner, monkeypatch
):
    big = ChatSessionFactory.create(owner=owner)
    big_ids = [m.pk for m in make_conversation(big, turns=10, words=30)]
    window = _window(big, below_id=big_ids[-1] + 1)
    monkeypatch.setattr(archive_window, "ENTRY_RUNES_MAX", window.runes + 10)
    assert not archive_window_words_build(owner_id=owner.pk, session_id=big.pk)
    kept = archive_window._windows[(owner.pk, big.pk)]
    # Still kept, its rows first, and not built again to be thrown away.
    assert kept.rows is window.rows and kept.word_rows is None and kept.words_tried
    assert not archive_window_words_build(owner_id=owner.pk, session_id=big.pk)
    assert archive_window.archive_window_ready(
        owner_id=owner.pk, session_id=big.pk, version=big.messages_version, below_id=None
    )
    # A list added to the cache may push out the least recently used window.
    monkeypatch.setattr(archive_window, "ENTRY_RUNES_MAX", 10**9)
    small = ChatSessionFactory.create(owner=owner)
    small_ids = [m.pk for m in make_conversation(small, turns=10)]
    listed = _window(small, below_id=small_ids[-1] + 1)
    monkeypatch.setattr(archive_window, "CACHE_RUNES_MAX", archive_window._kept_runes + 10)
    assert archive_window_words_build(owner_id=owner.pk, session_id=small.pk)
    assert set(archive_window._windows) == {(owner.pk, small.pk)}  # the big one went out
    assert archive_window._windows[(owner.pk, small.pk)].runes > listed.runes
    assert archive_window._kept_runes == sum(w.runes for w in archive_window._windows.values())
    assert archive_window._kept_runes <= archive_window.CACHE_RUNES_MAX


def test_the_build_waits_for_a_send_on_its_way(monkeypatch):
    monkeypatch.setattr(workers, "YIELD_MAX_SECONDS", 30.0)
    monkeypatch.setattr(workers, "YIELD_JOB_SECONDS", 30.0)
    monkeypatch.setattr(workers, "FOREGROUND_SECONDS", 30.0)
    done = threading.Event()

    def build() -> None:
        window_words_build(rows=_rows(["alpha beta"] * 10))
        done.set()

    key = workers.foreground_enter()
    try:
        workers.warm_submit("build", build)
        assert not done.wait(0.3)
    finally:
        workers.foreground_exit(key)
    assert done.wait(5)
