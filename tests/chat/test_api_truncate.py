import pytest

from chat.context import context_budget_from_row
from chat.models import ChatMessage, ChatSession, ContextSnapshot, SnapshotOutcome
from chat.services.sessions import message_truncate
from tests.factories import (
    ChatMessageFactory,
    ChatSessionFactory,
    ContextSnapshotFactory,
    make_conversation,
)

pytestmark = pytest.mark.django_db

TRUNCATE = "/api/v1/chat/truncate"


@pytest.fixture
def session(owner):
    s = ChatSessionFactory(owner=owner)
    make_conversation(s, turns=10)  # 20 messages
    return s


def ids(session):
    return list(session.messages.order_by("id").values_list("id", flat=True))


def compacted(session, *, throughs):
    """Record one committed compaction per `through` index and leave the session at the last."""
    all_ids = ids(session)
    snaps = []
    for i in throughs:
        snaps.append(
            ContextSnapshotFactory(
                session=session,
                summary=f"summary through #{i}",
                summary_through_message_id=all_ids[i],
                verbatim_since_message_id=all_ids[i + 1],
            )
        )
    last = snaps[-1]
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary=last.summary,
        verbatim_since_message_id=last.verbatim_since_message_id,
        context_version=len(snaps),
    )
    session.refresh_from_db()
    return snaps


def test_truncate_after_the_anchor_keeps_the_summary(api, session):
    compacted(session, throughs=[3, 7])
    all_ids = ids(session)
    response = api.post(
        TRUNCATE, {"session_id": session.pk, "message_id": all_ids[12]}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"deleted", "summary_rewound", "cancelled_reply_id", "context_budget"}
    assert body == {**body, "deleted": 8, "summary_rewound": False, "cancelled_reply_id": None}
    session.refresh_from_db()
    assert ids(session) == all_ids[:12]
    assert session.message_count == 12
    assert session.context_summary == "summary through #7"
    # Moved all the same: a compaction in flight must not commit what it read before the cut.
    assert session.context_version == 3
    assert not ContextSnapshot.objects.filter(outcome=SnapshotOutcome.REWOUND).exists()


def test_truncate_at_the_anchor_itself_keeps_the_summary(api, session):
    compacted(session, throughs=[7])
    anchor = session.verbatim_since_message_id
    body = api.post(
        TRUNCATE, {"session_id": session.pk, "message_id": anchor}, format="json"
    ).json()
    assert body["summary_rewound"] is False


def test_truncate_before_the_anchor_rewinds_to_the_right_snapshot(api, session):
    early, _middle, _late = compacted(session, throughs=[3, 9, 13])
    all_ids = ids(session)
    # Cut at message #8: snapshot through #9 and #13 mention deleted messages; #3 does not.
    body = api.post(
        TRUNCATE, {"session_id": session.pk, "message_id": all_ids[8]}, format="json"
    ).json()
    assert body["summary_rewound"] is True and body["deleted"] == 12
    session.refresh_from_db()
    assert session.context_summary == early.summary
    assert session.verbatim_since_message_id == early.verbatim_since_message_id
    assert session.context_version == 4
    rewind = ContextSnapshot.objects.get(outcome=SnapshotOutcome.REWOUND)
    assert rewind.summary == early.summary
    assert rewind.summary_through_message_id == all_ids[3]
    assert rewind.context_version == 4
    assert body["context_budget"] == context_budget_from_row(session=session)


def test_truncate_before_every_snapshot_empties_the_summary(api, session):
    compacted(session, throughs=[5, 9])
    all_ids = ids(session)
    body = api.post(
        TRUNCATE, {"session_id": session.pk, "message_id": all_ids[2]}, format="json"
    ).json()
    assert body["summary_rewound"] is True
    session.refresh_from_db()
    assert session.context_summary == ""
    assert session.verbatim_since_message_id is None
    assert session.message_count == 2


def test_second_truncation_never_resurrects_a_summary_of_deleted_messages(session):
    early, _late = compacted(session, throughs=[2, 12])
    all_ids = ids(session)
    message_truncate(session=session, message_id=all_ids[6])  # rewinds to "through #2"
    make_conversation(session, turns=5)
    new_ids = ids(session)[6:]
    # A compaction after the rewind, folding the surviving and new messages.
    ContextSnapshotFactory(
        session=session,
        summary="after rewind",
        summary_through_message_id=new_ids[3],
        verbatim_since_message_id=new_ids[4],
    )
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary="after rewind", verbatim_since_message_id=new_ids[4]
    )
    session.refresh_from_db()
    # Cutting before the last compaction must land on the rewind's state ("through #2"), not
    # on the older committed "through #12" snapshot, whose messages 6..12 no longer exist.
    result = message_truncate(session=session, message_id=new_ids[2])
    assert result.summary_rewound
    session.refresh_from_db()
    assert session.context_summary == early.summary


def test_message_of_another_session_is_404_and_deletes_nothing(api, session, owner):
    other = ChatSessionFactory(owner=owner)
    foreign = ChatMessageFactory(session=other)
    response = api.post(
        TRUNCATE, {"session_id": session.pk, "message_id": foreign.pk}, format="json"
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert ChatMessage.objects.count() == 21


@pytest.mark.parametrize(
    "payload",
    [{}, {"session_id": 1}, {"message_id": 1}, {"session_id": "x", "message_id": 1}, [1, 2]],
)
def test_bad_payloads_are_400(api, session, payload):
    if isinstance(payload, dict) and "session_id" in payload and payload["session_id"] == 1:
        payload = {**payload, "session_id": session.pk}
    response = api.post(TRUNCATE, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"error"}


def test_a_long_truncation_is_one_delete_and_takes_the_vectors(session):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.models import MessageVector

    make_conversation(session, turns=600)
    messages = list(session.messages.order_by("id"))
    for message in messages[5:8]:
        MessageVector.objects.create(message=message, session=session, model="m", embedding=b"")
    with CaptureQueriesContext(connection) as queries:
        result = message_truncate(session=session, message_id=messages[5].pk)
    assert result.deleted == len(messages) - 5
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    # Django's collector read every id and deleted them a hundred at a time.
    assert len(deletes) == 1, deletes
    assert not MessageVector.objects.exists()
    session.refresh_from_db()
    assert session.message_count == 5
