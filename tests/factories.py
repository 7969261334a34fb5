"""factory-boy factories shared by every test module."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from chat.models import (
    Agent,
    ChatMessage,
    ChatSession,
    ContextSnapshot,
    MessageRole,
    SnapshotOutcome,
)


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests-1")


class AgentFactory(factory.django.DjangoModelFactory[Agent]):
    class Meta:
        model = Agent

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"Agent {n}")
    system_prompt = "You are a careful assistant."


class ChatSessionFactory(factory.django.DjangoModelFactory[ChatSession]):
    class Meta:
        model = ChatSession

    owner = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"Chat {n}")


class ChatMessageFactory(factory.django.DjangoModelFactory[ChatMessage]):
    class Meta:
        model = ChatMessage

    session = factory.SubFactory(ChatSessionFactory)
    role = MessageRole.USER
    content = factory.Sequence(lambda n: f"message {n}")


def make_conversation(session: ChatSession, *, turns: int, words: int = 5) -> list[ChatMessage]:
    """Bulk-create `turns` user/assistant pairs and keep the session counters right."""
    rows = []
    for i in range(turns):
        rows.append(
            ChatMessage(session=session, role=MessageRole.USER, content=f"question {i} " * words)
        )
        rows.append(
            ChatMessage(session=session, role=MessageRole.ASSISTANT, content=f"answer {i} " * words)
        )
    created = ChatMessage.objects.bulk_create(rows)
    if created and created[0].pk is None:  # backends that do not return ids
        created = list(ChatMessage.objects.filter(session=session).order_by("id"))
    ChatSession.objects.filter(pk=session.pk).update(
        message_count=session.message_count + len(rows)
    )
    session.refresh_from_db()
    return created


class ContextSnapshotFactory(factory.django.DjangoModelFactory[ContextSnapshot]):
    """A committed compaction by default: `summary` stands for messages <= summary_through."""

    class Meta:
        model = ContextSnapshot

    session = factory.SubFactory(ChatSessionFactory)
    outcome = SnapshotOutcome.COMMITTED
    trigger = "test"
    strategy = "cadau"
    summary = factory.Sequence(lambda n: f"summary {n}")
