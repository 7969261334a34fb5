"""Message search (chat/search/): the selector on the real database's index, and
GET /api/v1/chat/search. Every search test runs twice: once answered by the window scan alone,
once with a one-message window so the trigram index (FTS5 on SQLite, pg_trgm on PostgreSQL)
answers everything below the newest message."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.search import backends, selectors
from chat.search.backends import Scope
from chat.search.selectors import message_ids_search
from tests.factories import ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/chat/search"


@pytest.fixture(params=["scan", "index"])
def path(request, monkeypatch):
    """`index`: the window holds the newest message only, so the index finds the rest."""
    if request.param == "index":
        monkeypatch.setattr(selectors, "WINDOW_ROWS", 1)
    return request.param


def _say(session, content, *, role=MessageRole.USER, **kwargs):
    return ChatMessageFactory(session=session, role=role, content=content, **kwargs)


def _ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [hit["message_id"] for hit in response.json()["results"]]


def test_finds_the_owners_messages_newest_first_with_marked_snippets(api, owner, path):
    session = ChatSessionFactory(owner=owner, title="Deploys")
    first = _say(session, "The nginx config lives in /etc/nginx/sites-enabled.")
    _say(session, "Unrelated chatter", role=MessageRole.ASSISTANT)
    second = _say(session, "Reload NGINX after every change.", role=MessageRole.ASSISTANT)
    _say(session, "latest message, no match")
    body = api.get(URL, {"q": "nginx"}).json()
    assert [h["message_id"] for h in body["results"]] == [second.pk, first.pk]
    hit = body["results"][0]
    assert hit["session_id"] == session.pk and hit["session_title"] == "Deploys"
    assert hit["role"] == "assistant" and hit["created_at"]
    start, end = hit["highlights"][0]
    assert hit["snippet"][start:end] == "NGINX"
    older = body["results"][1]
    assert [older["snippet"][a:b] for a, b in older["highlights"]] == ["nginx"] * 2
    assert body["next_cursor"] is None and body["mode"] == "index"


def test_another_users_messages_never_appear(api, owner, outsider, outsider_api, path):
    mine = ChatSessionFactory(owner=owner)
    theirs = ChatSessionFactory(owner=outsider)
    _say(theirs, "secret launch code ZX-81")
    _say(theirs, "secret again ZX-81")
    own = _say(mine, "my own ZX-81 note")
    _say(mine, "newest")
    assert _ids(api.get(URL, {"q": "ZX-81"})) == [own.pk]
    assert _ids(api.get(URL, {"q": "secret"})) == []
    # Naming their session is a 404, the same as a session that does not exist.
    refused = api.get(URL, {"q": "secret", "session_id": theirs.pk})
    assert refused.status_code == 404
    assert refused.json() == api.get(URL, {"q": "x", "session_id": 10**9}).json()
    assert len(_ids(outsider_api.get(URL, {"q": "ZX-81"}))) == 2


def test_session_and_role_filters(api, owner, path):
    one = ChatSessionFactory(owner=owner)
    two = ChatSessionFactory(owner=owner)
    asked = _say(one, "how do I rotate the Redis password?")
    answered = _say(one, "Rotate the Redis password with ACL SETUSER.", role=MessageRole.ASSISTANT)
    elsewhere = _say(two, "Redis is down again")
    _say(two, "newest")
    assert _ids(api.get(URL, {"q": "redis"})) == [elsewhere.pk, answered.pk, asked.pk]
    assert _ids(api.get(URL, {"q": "redis", "session_id": one.pk})) == [answered.pk, asked.pk]
    assert _ids(api.get(URL, {"q": "redis", "role": "user"})) == [elsewhere.pk, asked.pk]
    only = api.get(URL, {"q": "redis", "session_id": one.pk, "role": "assistant"})
    assert _ids(only) == [answered.pk]


def test_chinese_and_mixed_script_queries(api, owner, path):
    session = ChatSessionFactory(owner=owner)
    db = _say(session, "我们把数据库迁移到 PostgreSQL 了，数据库很快。")
    mixed = _say(session, "部署到 k8s 集群之前先跑 CI 流水线", role=MessageRole.ASSISTANT)
    _say(session, "完全无关的一句话")
    _say(session, "newest")
    assert _ids(api.get(URL, {"q": "数据库迁移"})) == [db.pk]
    assert _ids(api.get(URL, {"q": "k8s 集群"})) == [mixed.pk]
    assert _ids(api.get(URL, {"q": "postgresql 了"})) == [db.pk]
    # Two characters: too short for a trigram, found by the window scan.
    two = api.get(URL, {"q": "集群"}).json()
    assert [h["message_id"] for h in two["results"]] == [mixed.pk] and two["mode"] == "scan"
    hit = api.get(URL, {"q": "数据库"}).json()["results"][0]
    assert [hit["snippet"][a:b] for a, b in hit["highlights"]] == ["数据库", "数据库"]


def test_wildcards_and_quotes_are_literal(api, owner, path):
    session = ChatSessionFactory(owner=owner)
    literal = _say(session, 'grep for 100%_done and say "hi" \\ there')
    _say(session, "100 percent done, hi there")
    _say(session, "newest")
    assert _ids(api.get(URL, {"q": "100%_done"})) == [literal.pk]
    assert _ids(api.get(URL, {"q": '"hi" \\'})) == [literal.pk]
    assert _ids(api.get(URL, {"q": "%%%"})) == []
    # No letter with case: matched without folding (LIKE, plain instr), wildcards still literal.
    assert backends.caseless("100%_") and _ids(api.get(URL, {"q": "100%_"})) == [literal.pk]


def test_a_query_without_cased_letters_is_matched_without_folding():
    assert backends.caseless("数据库") and backends.caseless("42 -> 43") and backends.caseless("—")
    # Anything with case goes the folding way: ASCII, other scripts, and letters whose folding
    # changes their length.
    for text in ("k8s", "Код", "ß", "ﬁ", "数据库 SQL", "Ǆ"):
        assert not backends.caseless(text), text


def test_pages_walk_every_match_once(api, owner, path):
    session = ChatSessionFactory(owner=owner)
    matches = [_say(session, f"deploy number {i}").pk for i in range(25)]
    _say(session, "newest")
    seen: list[int] = []
    params = {"q": "deploy", "limit": 10}
    while True:
        body = api.get(URL, params).json()
        seen += [h["message_id"] for h in body["results"]]
        if body["next_cursor"] is None:
            break
        params = {**params, "before": body["next_cursor"]}
    assert seen == matches[::-1]


def test_a_short_query_scans_one_window_per_page_and_continues(api, owner, monkeypatch):
    monkeypatch.setattr(selectors, "SHORT_QUERY_WINDOW_ROWS", 4)
    session = ChatSessionFactory(owner=owner)
    old = _say(session, "旧的集群")
    for i in range(11):
        _say(session, f"filler {i}")
    body = api.get(URL, {"q": "集群"}).json()
    assert body["results"] == [] and body["mode"] == "scan" and body["next_cursor"]
    body = api.get(URL, {"q": "集群", "before": body["next_cursor"]}).json()
    assert body["results"] == [] and body["next_cursor"]
    body = api.get(URL, {"q": "集群", "before": body["next_cursor"]}).json()
    assert [h["message_id"] for h in body["results"]] == [old.pk]
    # A full window cannot tell whether it was the last: one more (empty) page ends the walk.
    if body["next_cursor"] is not None:
        body = api.get(URL, {"q": "集群", "before": body["next_cursor"]}).json()
        assert body == {"results": [], "next_cursor": None, "mode": "scan"}


def test_deleted_messages_leave_the_index_and_edits_are_reindexed(owner, path):
    session = ChatSessionFactory(owner=owner)
    gone = _say(session, "ephemeral token abc123")
    edited = _say(session, "first draft mentions kumquat")
    _say(session, "newest")
    scope = Scope(owner_id=owner.pk)

    def found(query: str) -> list[int]:
        return message_ids_search(scope=scope, query=query, limit=10).ids

    assert found("abc123") == [gone.pk]
    gone.delete()
    assert found("abc123") == []
    edited.content = "second draft mentions persimmon"
    edited.save()
    assert found("kumquat") == [] and found("persimmon") == [edited.pk]
    # A raw UPDATE (how the streaming progress saves write) is re-indexed as well.
    ChatMessage.objects.filter(pk=edited.pk).update(content="third draft: quince")
    assert found("persimmon") == [] and found("quince") == [edited.pk]


def test_a_reply_still_streaming_is_found_once_it_finishes(owner, path):
    session = ChatSessionFactory(owner=owner)
    reply = _say(
        session, "partial answer about zeppelins", role=MessageRole.ASSISTANT,
        status=MessageStatus.STREAMING,
    )  # fmt: skip
    _say(session, "newest")
    scope = Scope(owner_id=owner.pk)
    assert message_ids_search(scope=scope, query="zeppelin", limit=5).ids == []
    ChatMessage.objects.filter(pk=reply.pk).update(
        content="full answer about zeppelins", status=MessageStatus.COMPLETE
    )
    assert message_ids_search(scope=scope, query="zeppelin", limit=5).ids == [reply.pk]


def test_truncating_removes_the_cut_messages_hits(api, owner, path):
    session = ChatSessionFactory(owner=owner)
    kept = _say(session, "plan A: rollout on monday")
    cut = _say(session, "plan B: rollout on friday", role=MessageRole.ASSISTANT)
    _say(session, "newest")
    response = api.post(
        "/api/v1/chat/truncate", {"session_id": session.pk, "message_id": cut.pk}, format="json"
    )
    assert response.status_code == 200, response.content
    assert _ids(api.get(URL, {"q": "rollout"})) == [kept.pk]
    assert _ids(api.get(URL, {"q": "newest"})) == []


def test_deleting_a_session_removes_its_hits(api, owner, path):
    session = ChatSessionFactory(owner=owner)
    _say(session, "orphaned needle")
    _say(session, "newest")
    session.delete()
    assert _ids(api.get(URL, {"q": "needle"})) == []


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, "invalid"),
        ({"q": ""}, "invalid"),
        ({"q": "   "}, "invalid"),
        ({"q": "x" * 201}, "invalid"),
        ({"q": "x" * 5000}, "invalid"),
        ({"q": "a\x00b"}, "invalid"),
        ({"q": "ok", "role": "system"}, "invalid"),
        ({"q": "ok", "limit": 0}, "invalid"),
        ({"q": "ok", "limit": 51}, "invalid"),
        ({"q": "ok", "session_id": "abc"}, "invalid"),
        ({"q": "ok", "before": "garbage"}, "invalid_cursor"),
    ],
)
def test_bad_input_is_a_clear_400(api, owner, params, code):
    response = api.get(URL, params)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_a_cursor_only_continues_its_own_search(api, owner, outsider_api, monkeypatch):
    monkeypatch.setattr(selectors, "SHORT_QUERY_WINDOW_ROWS", 1)
    session = ChatSessionFactory(owner=owner)
    for i in range(3):
        _say(session, f"ab {i}")
    cursor = api.get(URL, {"q": "zz"}).json()["next_cursor"]
    assert cursor
    for params in (
        {"q": "other", "before": cursor},
        {"q": "zz", "role": "user", "before": cursor},
        {"q": "zz", "session_id": session.pk, "before": cursor},
    ):
        refused = api.get(URL, params)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_cursor"
    stolen = outsider_api.get(URL, {"q": "zz", "before": cursor})
    assert stolen.status_code == 400 and "another user" in stolen.json()["error"]["message"]
    # The same query in another case is the same search.
    assert api.get(URL, {"q": "ZZ", "before": cursor}).status_code == 200


def test_anonymous_callers_are_refused(anon_api):
    assert anon_api.get(URL, {"q": "anything"}).status_code in (401, 403)


def test_searches_are_throttled_per_user(api, owner, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "message_search": "2/min"}
    assert api.get(URL, {"q": "one"}).status_code == 200
    assert api.head(URL, {"q": "two"}).status_code == 200
    refused = api.get(URL, {"q": "three"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1


def test_a_page_costs_the_same_queries_whatever_it_holds(
    api, owner, django_assert_max_num_queries, path
):
    session = ChatSessionFactory(owner=owner)
    for i in range(30):
        _say(session, f"needle {i}")
    _say(session, "newest")
    # Window bounds, window hits, index hits, the rows; on PostgreSQL also the savepoint, the
    # time limit set and put back: never one query per hit.
    with django_assert_max_num_queries(8):
        assert len(_ids(api.get(URL, {"q": "needle", "limit": 50}))) == 30


def test_a_search_past_its_time_limit_is_a_503_and_changes_nothing(api, owner, monkeypatch):
    session = ChatSessionFactory(owner=owner)
    for i in range(50):
        _say(session, f"needle {i}")
    real_hits = backends.window_hits

    def slow_hits(**kwargs):
        # A statement that runs for seconds, as a search matching a huge index would.
        slow = (
            "SELECT pg_sleep(3)"
            if connection.vendor == "postgresql"
            else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
            "WHERE x < 100000000) SELECT count(*) FROM c"
        )
        with connection.cursor() as cursor:
            cursor.execute(slow)
        return real_hits(**kwargs)

    monkeypatch.setattr(backends, "window_hits", slow_hits)
    monkeypatch.setattr(selectors, "TIMEOUT_SECONDS", 0.2)
    started = time.monotonic()
    response = api.get(URL, {"q": "needle"})
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "search_timeout"
    assert time.monotonic() - started < 2.5
    monkeypatch.undo()
    assert len(_ids(api.get(URL, {"q": "needle", "limit": 50}))) == 50
