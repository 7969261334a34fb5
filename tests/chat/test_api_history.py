import pytest

from tests.factories import ChatMessageFactory, ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db

HISTORY = "/api/v1/chat/history"
TURNS = "/api/v1/chat/history/turns"
MESSAGE_KEYS = {"id", "session_id", "role", "content", "status", "created_at", "client_id"}


def assert_error(response, status, code=None):
    assert response.status_code == status, response.content
    assert set(response.json()) == {"error"}
    if code:
        assert response.json()["error"]["code"] == code


@pytest.fixture
def session(owner):
    s = ChatSessionFactory(owner=owner)
    make_conversation(s, turns=30)  # 60 messages
    return s


def all_ids(session):
    return list(session.messages.order_by("id").values_list("id", flat=True))


def test_first_call_returns_the_newest_page_oldest_first(api, session):
    body = api.get(HISTORY, {"session_id": session.pk, "limit": 10}).json()
    assert set(body) == {"messages", "older_cursor", "newer_cursor", "at_live_edge", "next_cursor"}
    assert [m["id"] for m in body["messages"]] == all_ids(session)[-10:]
    assert set(body["messages"][0]) >= MESSAGE_KEYS
    assert body["messages"][0]["session_id"] == session.pk
    assert body["at_live_edge"] is True
    assert body["older_cursor"] and body["next_cursor"] == body["older_cursor"]
    assert len(api.get(HISTORY, {"session_id": session.pk}).json()["messages"]) == 50


def test_walk_both_directions_over_http(api, session):
    expected = all_ids(session)
    body = api.get(HISTORY, {"session_id": session.pk, "limit": 7}).json()
    back = [m["id"] for m in body["messages"]]
    while body["older_cursor"]:
        body = api.get(
            HISTORY, {"session_id": session.pk, "limit": 7, "before": body["older_cursor"]}
        ).json()
        back = [m["id"] for m in body["messages"]] + back
    assert back == expected
    forward = [m["id"] for m in body["messages"]]
    while not body["at_live_edge"]:
        body = api.get(
            HISTORY, {"session_id": session.pk, "limit": 7, "after": body["newer_cursor"]}
        ).json()
        forward += [m["id"] for m in body["messages"]]
    assert forward == expected


def test_old_clients_cursor_means_before(api, session):
    first = api.get(HISTORY, {"session_id": session.pk, "limit": 10}).json()
    old = api.get(
        HISTORY, {"session_id": session.pk, "limit": 10, "cursor": first["next_cursor"]}
    ).json()
    assert [m["id"] for m in old["messages"]] == all_ids(session)[-20:-10]
    assert old["at_live_edge"] is False


def test_around_over_http(api, session):
    ids = all_ids(session)
    body = api.get(HISTORY, {"session_id": session.pk, "limit": 11, "around": ids[30]}).json()
    assert [m["id"] for m in body["messages"]] == ids[25:36]
    foreign = ChatMessageFactory()
    assert_error(
        api.get(HISTORY, {"session_id": session.pk, "around": foreign.pk}), 404, "not_found"
    )


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"session_id": "abc"},
        {"session_id": 0},
        {"limit": 0},
        {"limit": 201},
        {"limit": "ten"},
        {"around": "x"},
        {"around": 1, "before": "c"},
        {"before": "c", "after": "c"},
        {"cursor": "c", "before": "c"},
        {"around": 1, "cursor": "c"},
    ],
)
def test_history_rejects_bad_parameters(api, session, params):
    query = {"session_id": session.pk, **params}
    if params == {}:
        query = {}
    assert_error(api.get(HISTORY, query), 400, "invalid")


def test_unknown_session_is_404(api):
    assert_error(api.get(HISTORY, {"session_id": 10**9}), 404, "not_found")
    assert_error(api.get(TURNS, {"session_id": 10**9}), 404, "not_found")


def test_cursor_abuse_is_400(api, session, owner):
    other = ChatSessionFactory(owner=owner)
    make_conversation(other, turns=10)
    other_cursor = api.get(HISTORY, {"session_id": other.pk, "limit": 2}).json()["older_cursor"]
    mine = api.get(HISTORY, {"session_id": session.pk, "limit": 2}).json()
    payload, _, sig = mine["older_cursor"].rpartition(":")
    tampered = f"{payload}:{sig[::-1]}"
    for param, cursor in [
        ("before", "garbage"),
        ("before", tampered),
        ("before", other_cursor),  # the same user's other session
        ("after", mine["older_cursor"]),  # an older cursor used to go newer
        ("cursor", "x" * 2000),
    ]:
        response = api.get(HISTORY, {"session_id": session.pk, param: cursor})
        assert_error(response, 400, "invalid_cursor")
    turns_cursor = api.get(TURNS, {"session_id": session.pk, "limit": 1}).json()["next_cursor"]
    assert_error(
        api.get(HISTORY, {"session_id": session.pk, "before": turns_cursor}), 400, "invalid_cursor"
    )
    assert_error(
        api.get(TURNS, {"session_id": session.pk, "cursor": mine["older_cursor"]}),
        400,
        "invalid_cursor",
    )


def test_turns_endpoint(api, session):
    body = api.get(TURNS, {"session_id": session.pk, "limit": 25}).json()
    assert set(body) == {"turns", "next_cursor"}
    assert len(body["turns"]) == 25 and body["next_cursor"]
    assert set(body["turns"][0]) == {"message_id", "created_at", "preview"}
    user_ids = list(
        session.messages.filter(role="user").order_by("-id").values_list("id", flat=True)
    )
    rest = api.get(TURNS, {"session_id": session.pk, "cursor": body["next_cursor"]}).json()
    assert [t["message_id"] for t in body["turns"] + rest["turns"]] == user_ids
    assert rest["next_cursor"] is None
    assert (
        body["turns"][0]["preview"] == "question 29 question 29 question 29 question 29 question 29"
    )
    for bad in ({"limit": 0}, {"limit": 1001}, {}):
        query = {"session_id": session.pk, **bad} if bad else {}
        assert_error(api.get(TURNS, query), 400, "invalid")


@pytest.mark.parametrize("turns", [3, 400])
def test_query_counts_do_not_grow_with_the_session(api, owner, turns, django_assert_num_queries):
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=turns)
    ids = all_ids(session)
    sid = session.pk
    # session_for_user + the page; the newest page needs no probe.
    with django_assert_num_queries(2):
        newest = api.get(HISTORY, {"session_id": sid, "limit": 5}).json()
    # session_for_user + page + one EXISTS for the other side.
    with django_assert_num_queries(3):
        api.get(HISTORY, {"session_id": sid, "limit": 5, "before": newest["older_cursor"]})
    with django_assert_num_queries(3):
        api.get(HISTORY, {"session_id": sid, "limit": 5, "after": newest["newer_cursor"]})
    # session_for_user + the newer side (incl. the target) + the older side.
    with django_assert_num_queries(3):
        api.get(HISTORY, {"session_id": sid, "limit": 5, "around": ids[len(ids) // 2]})
    with django_assert_num_queries(2):
        api.get(TURNS, {"session_id": sid})
