import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from chat.models import ChatMessage, ChatSession, ContextSnapshot
from tests.factories import (
    AgentFactory,
    ChatMessageFactory,
    ChatSessionFactory,
    ContextSnapshotFactory,
    UserFactory,
    make_conversation,
)

pytestmark = pytest.mark.django_db

SESSIONS = "/api/v1/chat/sessions"
SESSION_KEYS = {
    "id",
    "title",
    "agent_id",
    "model",
    "created_at",
    "updated_at",
    "message_count",
    "context_budget",
}


def assert_error(response, status, code=None):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert {"code", "message"} <= set(body["error"])
    if code:
        assert body["error"]["code"] == code


def test_list_is_newest_activity_first_with_session_shape(api, owner):
    first = ChatSessionFactory(owner=owner)
    second = ChatSessionFactory(owner=owner)
    ChatSessionFactory()  # not the owner's
    ChatSession.objects.filter(pk=first.pk).update(last_activity_at=second.last_activity_at)
    response = api.get(SESSIONS)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"results", "next_cursor"}
    assert [s["id"] for s in body["results"]] == [second.pk, first.pk]
    assert body["next_cursor"] is None
    assert set(body["results"][0]) == SESSION_KEYS
    assert set(body["results"][0]["context_budget"]) == {"used_runes", "limit_runes", "used_pct"}


def test_list_pages_with_default_and_explicit_limit(api, owner):
    for _ in range(23):
        ChatSessionFactory(owner=owner)
    page = api.get(SESSIONS).json()
    assert len(page["results"]) == 20 and page["next_cursor"]
    rest = api.get(SESSIONS, {"cursor": page["next_cursor"]}).json()
    assert len(rest["results"]) == 3 and rest["next_cursor"] is None
    ids = [s["id"] for s in page["results"] + rest["results"]]
    assert len(set(ids)) == 23
    assert len(api.get(SESSIONS, {"limit": 5}).json()["results"]) == 5


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.5", "9" * 30])
def test_list_rejects_bad_limit(api, limit):
    assert_error(api.get(SESSIONS, {"limit": limit}), 400, "invalid")


def test_list_rejects_garbage_and_foreign_cursors(api, outsider_api, outsider):
    for _ in range(3):
        ChatSessionFactory(owner=outsider)
    foreign = outsider_api.get(SESSIONS, {"limit": 1}).json()["next_cursor"]
    assert_error(api.get(SESSIONS, {"cursor": foreign}), 400, "invalid_cursor")
    assert_error(api.get(SESSIONS, {"cursor": "garbage"}), 400, "invalid_cursor")


def test_list_budget_matches_the_engines_single_session_budget(api, owner):
    agent = AgentFactory(owner=owner, system_prompt="p" * 100)
    session = ChatSessionFactory(owner=owner, agent=agent, context_summary="s" * 50)
    msgs = make_conversation(session, turns=3)
    ChatMessageFactory(session=session, role="assistant", content="x" * 999, status="failed")
    ChatSession.objects.filter(pk=session.pk).update(verbatim_since_message_id=msgs[2].pk)
    plain = ChatSessionFactory(owner=owner)  # no agent, no summary, no messages
    listed = {s["id"]: s["context_budget"] for s in api.get(SESSIONS).json()["results"]}
    for sid in (session.pk, plain.pk):
        single = api.get(f"{SESSIONS}/{sid}").json()["context_budget"]
        assert listed[sid] == single
    budget = listed[session.pk]
    tail = sum(len(m.content) for m in msgs[2:])  # the failed reply is never sent
    assert budget["used_runes"] > 150 + tail
    assert budget["limit_runes"] > 0
    assert budget["used_pct"] == round(budget["used_runes"] * 100 / budget["limit_runes"], 1)


def test_list_query_count_is_constant(api, owner, django_assert_num_queries):
    for _ in range(2):
        make_conversation(ChatSessionFactory(owner=owner), turns=2)
    with django_assert_num_queries(1):
        assert len(api.get(SESSIONS).json()["results"]) == 2
    for _ in range(30):
        s = ChatSessionFactory(owner=owner, agent=AgentFactory(owner=owner))
        make_conversation(s, turns=5)
    with django_assert_num_queries(1):
        assert len(api.get(SESSIONS, {"limit": 100}).json()["results"]) == 32


def test_create_plain_and_with_own_agent(api, owner):
    response = api.post(SESSIONS, {}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == SESSION_KEYS
    assert body["title"] == "" and body["agent_id"] is None and body["message_count"] == 0
    agent = AgentFactory(owner=owner)
    response = api.post(SESSIONS, {"title": "Plans", "agent_id": agent.pk}, format="json")
    assert response.status_code == 201
    assert response.json()["agent_id"] == agent.pk
    assert ChatSession.objects.get(pk=response.json()["id"]).owner == owner


def test_create_with_someone_elses_agent_is_404(api, outsider):
    agent = AgentFactory(owner=outsider)
    assert_error(api.post(SESSIONS, {"agent_id": agent.pk}, format="json"), 404, "not_found")
    assert not ChatSession.objects.exists()


@pytest.mark.parametrize(
    "payload",
    [{"title": "x" * 201}, {"agent_id": "abc"}, {"agent_id": 0}, {"title": ["a"]}, ["a"], "text"],
)
def test_create_rejects_bad_payloads(api, payload):
    assert_error(api.post(SESSIONS, payload, format="json"), 400)


def test_bad_json_is_a_400(api):
    response = api.post(SESSIONS, data="{not json", content_type="application/json")
    assert_error(response, 400, "parse_error")


def test_retrieve_update_delete(api, owner):
    session = ChatSessionFactory(owner=owner)
    url = f"{SESSIONS}/{session.pk}"
    assert api.get(url).json()["id"] == session.pk
    response = api.patch(url, {"title": "Renamed"}, format="json")
    assert response.status_code == 200 and response.json()["title"] == "Renamed"
    assert api.delete(url).status_code == 204
    assert_error(api.get(url), 404)


@pytest.mark.parametrize("payload", [{"title": ""}, {"title": "   "}, {"title": "x" * 201}, {}])
def test_patch_rejects_empty_or_long_titles(api, owner, payload):
    session = ChatSessionFactory(owner=owner, title="Keep")
    assert_error(api.patch(f"{SESSIONS}/{session.pk}", payload, format="json"), 400, "invalid")
    session.refresh_from_db()
    assert session.title == "Keep"


@pytest.mark.parametrize("turns", [5, 600])
def test_delete_cascades_to_messages_and_snapshots(api, owner, turns, django_assert_num_queries):
    from chat.models import MessageVector

    session = ChatSessionFactory(owner=owner)
    messages = make_conversation(session, turns=turns)
    for message in messages[:3]:
        MessageVector.objects.create(message=message, session=session, model="m", embedding=b"")
    ContextSnapshotFactory(session=session)
    survivor = ChatSessionFactory(owner=owner)
    make_conversation(survivor, turns=1)
    # The database's cascades, in a DELETE per SESSION_DELETE_CHUNK messages and one for the
    # session: Django's collector read every message id first, and deleted them a hundred at
    # a time (the vectors cascade from messages). The session, whether a reply of it runs,
    # one chunk, the empty one that ends the loop, the session.
    with django_assert_num_queries(5):
        assert api.delete(f"{SESSIONS}/{session.pk}").status_code == 204
    assert not ChatMessage.objects.filter(session_id=session.pk).exists()
    assert not ContextSnapshot.objects.filter(session_id=session.pk).exists()
    assert not MessageVector.objects.exists()
    assert ChatMessage.objects.filter(session=survivor).count() == 2


@pytest.mark.parametrize("bad_id", ["abc", "0", "-1", "99999999999999999999999", "1.5"])
def test_malformed_or_missing_ids_are_json_404s(api, bad_id):
    assert_error(api.get(f"{SESSIONS}/{bad_id}"), 404, "not_found")


def test_context_endpoint(api, owner):
    session = ChatSessionFactory(
        owner=owner, context_summary="earlier things", verbatim_since_message_id=5
    )
    old = ContextSnapshotFactory(session=session, summary_through_message_id=2)
    new = ContextSnapshotFactory(session=session, summary_through_message_id=4)
    body = api.get(f"{SESSIONS}/{session.pk}/context").json()
    assert set(body) == {
        "context_summary",
        "verbatim_since_message_id",
        "context_budget",
        "snapshots",
    }
    assert body["context_summary"] == "earlier things"
    assert body["verbatim_since_message_id"] == 5
    assert [s["id"] for s in body["snapshots"]] == [new.pk, old.pk]
    limited = api.get(f"{SESSIONS}/{session.pk}/context", {"snapshots_limit": 1}).json()
    assert len(limited["snapshots"]) == 1


def test_token_endpoint_and_token_auth(owner):
    client = APIClient()
    response = client.post(
        "/api/v1/auth/token", {"username": "owner", "password": "pw-for-tests-1"}, format="json"
    )
    assert response.status_code == 200
    token = response.json()["token"]
    ChatSessionFactory(owner=owner)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert len(client.get(SESSIONS).json()["results"]) == 1
    bad = APIClient().post(
        "/api/v1/auth/token", {"username": "owner", "password": "wrong"}, format="json"
    )
    assert_error(bad, 400)


def test_browser_session_auth_works(owner):
    client = APIClient()
    assert client.login(username="owner", password="pw-for-tests-1")
    assert client.get(SESSIONS).status_code == 200


# --- access control: every endpoint, both personas ---------------------------------------------


def _endpoints(session, message):
    sid = session.pk
    return [
        ("get", f"{SESSIONS}/{sid}", None),
        ("patch", f"{SESSIONS}/{sid}", {"title": "mine now"}),
        ("delete", f"{SESSIONS}/{sid}", None),
        ("get", f"{SESSIONS}/{sid}/context", None),
        ("get", f"/api/v1/chat/history?session_id={sid}", None),
        ("get", f"/api/v1/chat/history?session_id={sid}&around={message.pk}", None),
        ("get", f"/api/v1/chat/history/turns?session_id={sid}", None),
        ("post", "/api/v1/chat/truncate", {"session_id": sid, "message_id": message.pk}),
    ]


def test_outsider_gets_404_everywhere_and_changes_nothing(outsider_api, owner):
    session = ChatSessionFactory(owner=owner, title="private")
    message = ChatMessageFactory(session=session)
    for method, url, payload in _endpoints(session, message):
        response = getattr(outsider_api, method)(url, payload, format="json")
        assert_error(response, 404, "not_found")
    agent = AgentFactory(owner=owner)
    assert_error(outsider_api.post(SESSIONS, {"agent_id": agent.pk}, format="json"), 404)
    assert outsider_api.get(SESSIONS).json()["results"] == []
    session.refresh_from_db()
    assert session.title == "private" and ChatMessage.objects.filter(pk=message.pk).exists()


def test_anonymous_is_refused_in_the_error_shape(anon_api, owner):
    session = ChatSessionFactory(owner=owner)
    message = ChatMessageFactory(session=session)
    for method, url, payload in [
        ("get", SESSIONS, None),
        ("post", SESSIONS, {}),
        *_endpoints(session, message),
    ]:
        response = getattr(anon_api, method)(url, payload, format="json")
        assert response.status_code in (401, 403)
        assert response.json()["error"]["code"] == "not_authenticated"
    assert ChatMessage.objects.filter(pk=message.pk).exists()


def test_inactive_user_token_is_refused(owner):
    user = UserFactory(username="gone")
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    client = APIClient()
    response = client.post(
        "/api/v1/auth/token", {"username": "gone", "password": "pw-for-tests-1"}, format="json"
    )
    assert_error(response, 400)


def test_a_long_session_goes_a_chunk_a_statement(api, owner, monkeypatch):
    # Each its own transaction outside a caller's: on SQLite a statement holds the database's
    # write lock, and a long chat's messages in one went on for seconds.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr("chat.services.sessions.SESSION_DELETE_CHUNK", 100)
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=250)  # 500 messages
    with CaptureQueriesContext(connection) as queries:
        assert api.delete(f"{SESSIONS}/{session.pk}").status_code == 204
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 5 + 1 + 1, deletes  # five chunks, the empty one, the session
    assert not ChatMessage.objects.filter(session_id=session.pk).exists()
    assert not any("SAVEPOINT" in q["sql"] for q in queries.captured_queries)
