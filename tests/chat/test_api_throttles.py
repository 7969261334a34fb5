"""Every API route counts against its user's allowance (chat/api/throttles.py): `api_read` for
reads, `api_write` for writes, on top of a route's own scope. Sends and regenerations count
only `chat_send` (tests/chat/test_send_limits.py), so nothing more runs before a first token."""

from __future__ import annotations

import pytest

from chat.models import ChatMessage, ChatSession
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rates(settings):
    def set_rates(**scopes: str) -> None:
        settings.RATE_LIMITS = {**settings.RATE_LIMITS, **scopes}

    return set_rates


def _refused(response) -> None:
    assert response.status_code == 429, response.content[:300]
    assert response.json()["error"]["code"] == "throttled"
    assert int(response["Retry-After"]) >= 1


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/chat/history?session_id={id}",
        "/api/v1/chat/history/turns?session_id={id}",
        "/api/v1/chat/sessions",
        "/api/v1/chat/sessions/{id}",
        "/api/v1/chat/sessions/{id}/context",
        "/api/v1/status",
        "/api/v1/agents",
    ],
)
def test_reads_without_a_scope_of_their_own_are_bounded_per_user(
    rates, api, outsider_api, owner, outsider, path
):
    rates(api_read="2/min")
    session = ChatSessionFactory.create(owner=owner)
    url = path.format(id=session.pk)
    assert [api.get(url).status_code for _ in range(2)] == [200, 200]
    _refused(api.get(url))
    # HEAD is the same work as GET, so the same count; OPTIONS is a read too.
    assert api.head(url).status_code == 429
    assert api.options(url).status_code == 429
    # Another user's allowance is their own.
    mine = ChatSessionFactory.create(owner=outsider)
    assert outsider_api.get(path.format(id=mine.pk)).status_code == 200


def test_a_refused_write_changes_nothing(rates, api, owner):
    rates(api_write="1/min")
    kept, other = ChatSessionFactory.create_batch(2, owner=owner)
    messages = make_conversation(kept, turns=2)
    assert api.delete(f"/api/v1/chat/sessions/{other.pk}").status_code == 204
    _refused(api.delete(f"/api/v1/chat/sessions/{kept.pk}"))
    _refused(
        api.post(
            "/api/v1/chat/truncate",
            {"session_id": kept.pk, "message_id": messages[0].pk},
            format="json",
        )
    )
    assert ChatSession.objects.filter(pk=kept.pk).exists()
    assert ChatMessage.objects.filter(session=kept).count() == len(messages)


def test_a_route_with_its_own_scope_counts_both(rates, api, owner):
    rates(api_read="100/min", context_read="1/min")
    session = ChatSessionFactory.create(owner=owner)
    url = f"/api/v1/chat/sessions/{session.pk}/snapshots"
    assert api.get(url).status_code == 200
    _refused(api.get(url))
    rates(api_read="1/min", context_read="100/min")
    _refused(api.get(url))


def test_a_request_the_general_allowance_refused_leaves_the_routes_own_alone(rates, api):
    # DRF asks every throttle even after one refused: "agent_create" was spent by creates
    # that "api_write" had refused (a day's allowance gone in a refused burst).
    rates(api_write="1/min", agent_create="2/min")
    assert api.post("/api/v1/agents", {"name": "one"}, format="json").status_code == 201
    for n in range(3):
        _refused(api.post("/api/v1/agents", {"name": f"refused {n}"}, format="json"))
    rates(api_write="100/min", agent_create="2/min")
    assert api.post("/api/v1/agents", {"name": "two"}, format="json").status_code == 201
    _refused(api.post("/api/v1/agents", {"name": "three"}, format="json"))


@pytest.mark.parametrize("path", ["/api/v1/chat/send", "/api/v1/chat/regenerate"])
def test_a_send_whose_body_is_refused_spends_the_write_allowance(rates, api, owner, path):
    # A valid send counts chat_send in the turn service; one that never validates counted
    # nothing, however large its body.
    rates(api_write="2/min", chat_send="100/min")
    session = ChatSessionFactory.create(owner=owner)
    bad = {"session_id": "abc", "content": "x" * 100_000}
    assert api.post(path, bad, format="json").status_code == 400
    not_json = api.post(path, b"{not json", content_type="application/json")
    assert not_json.status_code == 400
    _refused(api.post(path, bad, format="json"))
    _refused(api.post(path, bad, format="json", HTTP_ACCEPT="text/event-stream"))
    assert ChatMessage.objects.filter(session=session).count() == 0


@pytest.mark.parametrize("path", ["/api/v1/chat/send", "/api/v1/chat/regenerate"])
def test_a_send_of_another_media_type_spends_the_write_allowance(rates, api, path):
    rates(api_write="1/min", chat_send="100/min")
    assert api.post(path, b"x" * 100_000, content_type="text/plain").status_code == 415
    _refused(api.post(path, b"x" * 100_000, content_type="text/plain"))


def test_sends_do_not_spend_the_write_allowance(rates, api, owner, fake_llm):
    rates(api_write="1/min", chat_send="100/min")
    session = ChatSessionFactory.create(owner=owner)
    for n in range(3):
        response = api.post(
            "/api/v1/chat/send", {"session_id": session.pk, "content": f"m{n}"}, format="json"
        )
        assert response.status_code == 200, response.content[:300]
    # Reads and writes have their own allowances: three sends left the write one whole.
    assert api.delete(f"/api/v1/chat/sessions/{session.pk}").status_code == 204
