import re

import pytest
from django.urls import reverse

from chat.models import ChatMessage
from tests.factories import (
    AgentFactory,
    ChatSessionFactory,
    ContextSnapshotFactory,
    UserFactory,
    make_conversation,
)
from tests.fixtures_llm import summary_of

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


@pytest.mark.django_db(transaction=True)
def test_admin_actions_recompact_and_reset(client, fake_llm, settings):
    from cadau.contextconfig import ContextConfig
    from chat.models import ChatSession, ContextSnapshot
    from devtools.introspect import background_wait
    from tests.factories import ChatSessionFactory, UserFactory, make_conversation

    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=20000, summary_max_runes=500, min_verbatim=2
    )
    admin_user = UserFactory.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    session = ChatSessionFactory.create()
    make_conversation(session, turns=6, words=10)
    fake_llm.script_summary(summary_of("admin summary"))
    url = "/admin/chat/chatsession/"
    r = client.post(url, {"action": "recompact", "_selected_action": [session.pk]})
    assert r.status_code == 302
    background_wait(timeout=30)
    session.refresh_from_db()
    assert session.context_summary == summary_of("admin summary")
    r = client.post(url, {"action": "reset_summary", "_selected_action": [session.pk]})
    assert r.status_code == 302
    session = ChatSession.objects.get(pk=session.pk)
    assert session.context_summary == "" and session.verbatim_since_message_id is None
    assert list(
        ContextSnapshot.objects.filter(session=session)
        .order_by("id")
        .values_list("outcome", "trigger")
    ) == [("committed", "admin"), ("reset", "admin")]


def test_message_search_uses_the_index_and_finds_chinese(admin_client, data):
    _, session, _, _ = data
    hit = ChatMessage.objects.create(session=session, role="user", content="部署到生产环境的步骤")
    url = reverse("admin:chat_chatmessage_changelist")
    page = admin_client.get(url, {"q": "生产环境"}).content.decode()
    assert f"/{hit.pk}/change/" in page
    assert "question" not in admin_client.get(url, {"q": "生产环境"}).content.decode()
    refused = admin_client.get(url, {"q": "x" * 300})
    assert refused.status_code == 200 and "at most 200 characters" in refused.content.decode()


def test_a_session_saved_in_the_admin_keeps_what_moved_since_its_form_was_loaded(data):
    """The form was loaded, then a truncation (or a compaction) committed: saving the form's
    title must not write back the versions, summary and anchor it loaded."""
    from django.contrib import admin as django_admin
    from django.test import RequestFactory

    from chat.admin import ChatSessionAdmin
    from chat.models import ChatSession
    from chat.services.sessions import message_truncate

    _, session, messages, _ = data
    model_admin = ChatSessionAdmin(ChatSession, django_admin.site)
    loaded = ChatSession.objects.get(pk=session.pk)
    form_class = model_admin.get_form(RequestFactory().get("/"), loaded)
    form = form_class(
        {"owner": loaded.owner_id, "agent": loaded.agent_id, "title": "Renamed"},
        instance=loaded,
    )
    assert form.is_valid(), form.errors
    message_truncate(session=session, message_id=messages[-2].pk)
    moved = ChatSession.objects.get(pk=session.pk)
    model_admin.save_model(None, form.save(commit=False), form, True)
    saved = ChatSession.objects.get(pk=session.pk)
    assert saved.title == "Renamed"
    assert saved.messages_version == moved.messages_version > loaded.messages_version
    assert saved.context_version == moved.context_version
    assert saved.message_count == moved.message_count


@pytest.mark.parametrize("turns", [3, 300])
def test_a_sessions_delete_confirmation_counts_what_goes_instead_of_listing_it(
    admin_client, turns, django_assert_max_num_queries
):
    # Django's confirmation lists every row that cascades: a long chat's page would read and
    # render all its messages. Ours counts them, in the same few queries whatever the length.
    session = ChatSessionFactory(title="long chat")
    make_conversation(session, turns=turns)
    ContextSnapshotFactory(session=session)
    with django_assert_max_num_queries(12):
        response = admin_client.get(reverse("admin:chat_chatsession_delete", args=[session.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Chat session: long chat" in page and f"{2 * turns} messages" in page
    assert "question 0" not in page  # no message listed
    assert f"Chat messages: {2 * turns}" in page and "Context snapshots: 1" in page
    response = admin_client.post(
        reverse("admin:chat_chatsession_delete", args=[session.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not ChatMessage.objects.filter(session_id=session.pk).exists()


def test_a_staff_member_who_may_not_delete_messages_may_not_delete_a_session_with_them(client):
    from django.contrib.auth.models import Permission

    session = ChatSessionFactory()
    make_conversation(session, turns=1)
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_chatsession", "delete_chatsession"])
    )
    client.force_login(staff)
    url = reverse("admin:chat_chatsession_delete", args=[session.pk])
    assert "Cannot delete" in client.get(url).content.decode()
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert ChatMessage.objects.filter(session_id=session.pk).count() == 2


def test_a_users_delete_confirmation_counts_their_chats_rows(
    admin_client, django_assert_max_num_queries
):
    owner = UserFactory(username="leaving")
    agent = AgentFactory(owner=owner)
    sessions = [ChatSessionFactory(owner=owner, agent=agent) for _ in range(2)]
    for session in sessions:
        make_conversation(session, turns=50)
    url = reverse("admin:auth_user_delete", args=[owner.pk])
    with django_assert_max_num_queries(16):
        response = admin_client.get(url)
    page = response.content.decode()
    assert "User: leaving" in page and "question 0" not in page
    assert "Chat messages: 200" in page and "Chat sessions: 2" in page and "Agents: 1" in page
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not ChatMessage.objects.filter(session__in=sessions).exists()
    # A DELETE per chunk of each session's messages: the collector read every message id,
    # and deleted them a hundred at a time.
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sql if q.startswith('SELECT "chat_messages"."id" FROM')]
    assert len([q for q in sql if q.startswith('DELETE FROM "chat_messages"')]) == 2 * 2


def test_a_chat_moved_to_another_owner_cannot_keep_the_first_owners_agent(admin_client, data):
    # Its tools would have read and written the first owner's memory and workspace.
    agent, session, _messages, _snapshot = data
    other = UserFactory(username="newowner")
    url = reverse("admin:chat_chatsession_change", args=[session.pk])
    page = admin_client.get(url).content.decode()
    # The snapshots inline's management form, as the page has it.
    hidden = re.findall(
        r'name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)" value="(\d*)"', page
    )
    form = {"owner": other.pk, "agent": agent.pk, "title": session.title, **dict(hidden)}
    response = admin_client.post(url, form)
    assert response.status_code == 200 and "belongs to another user" in response.content.decode()
    session.refresh_from_db()
    assert session.owner_id == agent.owner_id
    # Without the agent, the move is allowed.
    form["agent"] = ""
    assert admin_client.post(url, form).status_code == 302
    session.refresh_from_db()
    assert session.owner_id == other.pk and session.agent_id is None


def test_an_agent_in_use_by_its_owners_chats_cannot_be_given_to_another_user(admin_client, data):
    agent, session, _messages, _snapshot = data
    other = UserFactory(username="taker")
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    form = {
        "owner": other.pk,
        "name": agent.name,
        "system_prompt": agent.system_prompt,
        "model": agent.model,
        "config_json": "{}",
        "created_at_0": "2026-01-01",
        "created_at_1": "00:00:00",
    }
    response = admin_client.post(url, form)
    assert "Chats of another user use this agent" in response.content.decode()
    agent.refresh_from_db()
    assert agent.owner_id == session.owner_id
