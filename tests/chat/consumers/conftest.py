"""Fixtures of the consumer tests: the owner's login cookie and a session of theirs; and, for
every test here, replies finish and each test gets its own channel layer (loop_left_clean)."""

from __future__ import annotations

import pytest

from chat.models import ChatSession
from tests.chat.consumers.helpers import cookie_for
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import ChatSessionFactory

# Autouse where it is imported: replies finish, and each test gets its own channel layer.
loop_left_clean = _loop_left_clean


@pytest.fixture
def owner_cookie(owner) -> str:
    return cookie_for(owner)


@pytest.fixture
def session(owner) -> ChatSession:
    created: ChatSession = ChatSessionFactory.create(owner=owner)
    return created
