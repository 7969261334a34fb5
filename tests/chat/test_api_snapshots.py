"""GET /api/v1/chat/sessions/{id}/snapshots: the compaction history the page shows, read-only,
owner-checked, throttled, keyset-paged by id."""

from __future__ import annotations

import pytest

from chat.context.heading import SUMMARY_PREFIX_EN
from chat.models import ChatSession, ContextSnapshot, SnapshotOutcome
from tests.factories import ChatSessionFactory, ContextSnapshotFactory, make_conversation

pytestmark = pytest.mark.django_db


def url(session_id) -> str:
    return f"/api/v1/chat/sessions/{session_id}/snapshots"


@pytest.fixture
def session(owner) -> ChatSession:
    s: ChatSession = ChatSessionFactory.create(owner=owner)
    rows = make_conversation(s, turns=10)
    for i in range(5):
        ContextSnapshotFactory(
            session=s,
            summary=f"summary {i}",
            covers_from_message_id=rows[0].pk,
            covers_to_message_id=rows[2 * i + 1].pk,
            summary_through_message_id=rows[2 * i + 1].pk,
            verbatim_since_message_id=rows[2 * i + 2].pk,
        )
    ChatSession.objects.filter(pk=s.pk).update(
        context_summary="summary 4", verbatim_since_message_id=rows[10].pk
    )
    s.refresh_from_db()
    return s


def test_the_summary_in_force_and_pages_of_snapshots_newest_first(api, session):
    first = api.get(url(session.pk), {"limit": 2}).json()
    assert first["summary"] == {
        "text": "summary 4",
        "heading": SUMMARY_PREFIX_EN,
        "verbatim_since_message_id": session.verbatim_since_message_id,
    }
    assert [s["summary"] for s in first["snapshots"]] == ["summary 4", "summary 3"]
    snap = first["snapshots"][0]
    assert snap["outcome"] == "committed" and snap["created_at"]
    assert snap["covers_to_message_id"] < snap["verbatim_since_message_id"]
    seen = [s["id"] for s in first["snapshots"]]
    before = first["next_before"]
    while before is not None:
        page = api.get(url(session.pk), {"limit": 2, "before": before}).json()
        seen += [s["id"] for s in page["snapshots"]]
        before = page["next_before"]
    expected = list(
        ContextSnapshot.objects.filter(session=session).order_by("-id").values_list("id", flat=True)
    )
    assert seen == expected


def test_a_session_never_compacted_has_an_empty_history(api, owner):
    fresh = ChatSessionFactory(owner=owner)
    body = api.get(url(fresh.pk)).json()
    assert body["summary"]["text"] == "" and body["snapshots"] == []
    assert body["next_before"] is None


def test_failed_summaries_keep_the_model_servers_words_from_non_staff(api, session):
    ContextSnapshotFactory(
        session=session, outcome=SnapshotOutcome.FAILED, summary="", error="10.0.0.5:8080 refused"
    )
    snap = api.get(url(session.pk)).json()["snapshots"][0]
    assert snap["outcome"] == "failed" and "10.0.0.5" not in snap["error"]


def test_someone_elses_or_a_missing_session_is_a_404(outsider_api, session):
    for sid in (session.pk, session.pk + 10_000, "abc"):
        response = outsider_api.get(url(sid))
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "query", [{"limit": 0}, {"limit": 51}, {"limit": "x"}, {"before": 0}, {"before": "x"}]
)
def test_bad_paging_is_a_400(api, session, query):
    response = api.get(url(session.pk), query)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_reads_are_throttled_per_user(api, session, settings):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "context_read": "2/min"}
    assert [api.get(url(session.pk)).status_code for _ in range(3)] == [200, 200, 429]
    assert api.get(url(session.pk)).json()["error"]["code"] == "throttled"


def test_anonymous_is_refused(anon_api, session):
    assert anon_api.get(url(session.pk)).status_code in (401, 403)
