import pytest
from django.http import Http404

from chat.cursors import InvalidCursor
from chat.models import MessageRole
from chat.selectors import history_page, session_list, turn_preview, turns_page
from tests.factories import ChatMessageFactory, ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db


def ids(rows):
    return [m.pk for m in rows]


def walk_back(session, limit):
    page = history_page(session=session, limit=limit)
    pages = [page]
    while page.older_cursor:
        page = history_page(session=session, limit=limit, before=page.older_cursor)
        pages.append(page)
    return pages


def walk_forward(session, limit, start):
    page = history_page(session=session, limit=limit, after=start)
    pages = [page]
    while not page.at_live_edge:
        page = history_page(session=session, limit=limit, after=page.newer_cursor)
        pages.append(page)
    return pages


@pytest.fixture
def session():
    s = ChatSessionFactory()
    make_conversation(s, turns=23)  # 46 messages
    return s


@pytest.mark.parametrize("limit", [1, 3, 7, 46, 50])
def test_walking_back_sees_every_message_once_in_order(session, limit):
    expected = list(session.messages.order_by("id").values_list("id", flat=True))
    pages = walk_back(session, limit)
    seen = [mid for page in reversed(pages) for mid in ids(page.messages)]
    assert seen == expected
    assert all(len(p.messages) <= limit for p in pages)
    assert pages[0].at_live_edge
    assert pages[-1].older_cursor is None


@pytest.mark.parametrize("limit", [1, 4, 46])
def test_walking_forward_from_the_oldest_sees_every_message_once(session, limit):
    expected = list(session.messages.order_by("id").values_list("id", flat=True))
    oldest = walk_back(session, limit)[-1]
    seen = ids(oldest.messages)
    if not oldest.at_live_edge:
        for page in walk_forward(session, limit, oldest.newer_cursor):
            seen += ids(page.messages)
    assert seen == expected


def test_inserts_between_fetches_are_neither_lost_nor_duplicated(session):
    first = history_page(session=session, limit=5)
    # Walk back while new messages arrive: older pages are unaffected by appends.
    older_ids, page = [], first
    while page.older_cursor:
        ChatMessageFactory(session=session, content="arrived while scrolling up")
        page = history_page(session=session, limit=5, before=page.older_cursor)
        older_ids = ids(page.messages) + older_ids
    # Then catch up from the first page's newer edge, inserting as we go.
    newer_ids, cursor = [], first.newer_cursor
    for _ in range(100):
        page = history_page(session=session, limit=3, after=cursor)
        newer_ids += ids(page.messages)
        cursor = page.newer_cursor
        if page.at_live_edge:
            break
        ChatMessageFactory(session=session, content="arrived while catching up")
    seen = older_ids + ids(first.messages) + newer_ids
    assert seen == list(session.messages.order_by("id").values_list("id", flat=True))
    assert len(seen) == len(set(seen))


def test_live_edge_cursor_fetches_later_messages(session):
    page = history_page(session=session, limit=10)
    assert page.at_live_edge
    assert history_page(session=session, limit=10, after=page.newer_cursor).messages == []
    new = ChatMessageFactory(session=session)
    later = history_page(session=session, limit=10, after=page.newer_cursor)
    assert ids(later.messages) == [new.pk]
    assert later.at_live_edge and later.older_cursor is not None


def test_empty_session():
    empty = ChatSessionFactory()
    page = history_page(session=empty, limit=10)
    assert page.messages == [] and page.older_cursor is None and page.at_live_edge
    first = ChatMessageFactory(session=empty)
    assert ids(history_page(session=empty, limit=10, after=page.newer_cursor).messages) == [
        first.pk
    ]


@pytest.mark.parametrize(("position", "limit"), [(0, 9), (1, 9), (22, 9), (45, 9), (44, 10)])
def test_around_windows(session, position, limit):
    all_ids = list(session.messages.order_by("id").values_list("id", flat=True))
    target = all_ids[position]
    page = history_page(session=session, limit=limit, around=target)
    window = ids(page.messages)
    assert target in window
    assert len(window) == limit  # a full window even at either end
    start = all_ids.index(window[0])
    assert window == all_ids[start : start + limit]
    if 4 <= position <= len(all_ids) - 6:
        # Centred: the target sits in the middle of the window.
        assert window.index(target) == (limit - 1) // 2
    assert (page.older_cursor is None) == (start == 0)
    assert page.at_live_edge == (window[-1] == all_ids[-1])
    # The window's cursors continue seamlessly in both directions.
    if page.older_cursor:
        older = history_page(session=session, limit=limit, before=page.older_cursor)
        assert ids(older.messages)[-1] == all_ids[start - 1]
    if not page.at_live_edge:
        newer = history_page(session=session, limit=limit, after=page.newer_cursor)
        assert ids(newer.messages)[0] == all_ids[start + limit]


def test_around_a_message_of_another_session_is_404(session):
    other = ChatMessageFactory()
    with pytest.raises(Http404):
        history_page(session=session, limit=10, around=other.pk)
    with pytest.raises(Http404):
        history_page(session=session, limit=10, around=10**12)


def test_cursor_from_another_session_or_direction_is_rejected(session):
    other = ChatSessionFactory()
    make_conversation(other, turns=5)
    foreign = history_page(session=other, limit=2)
    with pytest.raises(InvalidCursor):
        history_page(session=session, limit=2, before=foreign.older_cursor)
    mine = history_page(session=session, limit=2)
    with pytest.raises(InvalidCursor):
        history_page(session=session, limit=2, after=mine.older_cursor)
    turns = turns_page(session=session, limit=2)
    with pytest.raises(InvalidCursor):
        history_page(session=session, limit=2, before=turns.next_cursor)


def test_turns_are_user_messages_newest_first_and_page_completely(session):
    user_ids = list(
        session.messages.filter(role=MessageRole.USER).order_by("-id").values_list("id", flat=True)
    )
    seen, cursor = [], None
    while True:
        page = turns_page(session=session, limit=4, cursor=cursor)
        seen += [t.message_id for t in page.turns]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == user_ids


def test_turn_preview_collapses_whitespace_and_caps_length():
    assert turn_preview("  hello\n\n\tworld  ") == "hello world"
    long = turn_preview("word " * 100)
    assert len(long) <= 120 and long.endswith("…")
    msg = ChatMessageFactory(content="\n\n   " + "x" * 5000)
    (turn,) = turns_page(session=msg.session, limit=5).turns
    assert turn.preview.startswith("xxx") and len(turn.preview) == 120


def test_session_list_walks_ties_on_activity_without_gaps(owner):
    stamp = ChatSessionFactory(owner=owner).last_activity_at
    for _ in range(6):
        ChatSessionFactory(owner=owner, last_activity_at=stamp)
    ChatSessionFactory()  # someone else's
    expected = list(
        owner.chat_sessions.order_by("-last_activity_at", "-id").values_list("id", flat=True)
    )
    seen, cursor = [], None
    while True:
        page = session_list(user=owner, limit=2, cursor=cursor)
        seen += [s.pk for s in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected and len(seen) == 7
