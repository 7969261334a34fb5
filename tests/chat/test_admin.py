import pytest
from django.urls import reverse

from tests.factories import (
    AgentFactory,
    ChatSessionFactory,
    ContextSnapshotFactory,
    UserFactory,
    make_conversation,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.fixture
def data():
    agent = AgentFactory()
    session = ChatSessionFactory(owner=agent.owner, agent=agent, context_summary="old turns")
    messages = make_conversation(session, turns=3)
    snapshot = ContextSnapshotFactory(session=session, summary_through_message_id=messages[1].pk)
    return agent, session, messages, snapshot


@pytest.mark.parametrize("model", ["agent", "chatsession", "chatmessage", "contextsnapshot"])
def test_changelists_render(admin_client, data, model):
    response = admin_client.get(reverse(f"admin:chat_{model}_changelist"))
    assert response.status_code == 200


def test_message_search_and_filters(admin_client, data):
    url = reverse("admin:chat_chatmessage_changelist")
    response = admin_client.get(url, {"q": "question 1", "role__exact": "user"})
    assert response.status_code == 200
    assert "question 1" in response.content.decode()


def test_change_pages_render_with_snapshot_inline(admin_client, data):
    agent, session, messages, snapshot = data
    response = admin_client.get(reverse("admin:chat_chatsession_change", args=[session.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "old turns" in page and "committed" in page and "runes" in page
    for name, obj in [
        ("agent", agent),
        ("chatmessage", messages[0]),
        ("contextsnapshot", snapshot),
    ]:
        url = reverse(f"admin:chat_{name}_change", args=[obj.pk])
        assert admin_client.get(url).status_code == 200


def test_session_changelist_query_count_is_flat(admin_client, data, django_assert_max_num_queries):
    owner = data[0].owner
    for _ in range(20):
        make_conversation(ChatSessionFactory(owner=owner, agent=AgentFactory(owner=owner)), turns=2)
    # Session, auth, the page (budget annotated), a COUNT: nothing per row.
    with django_assert_max_num_queries(8):
        assert admin_client.get(reverse("admin:chat_chatsession_changelist")).status_code == 200
