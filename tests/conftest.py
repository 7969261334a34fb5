"""Shared fixtures: the two personas every access test uses, and API clients for them."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import UserFactory

# Area fixtures live in their own plugin modules so parallel work does not collide here.
pytest_plugins = ["tests.fixtures_llm"]


@pytest.fixture
def owner(db):
    return UserFactory(username="owner")


@pytest.fixture
def outsider(db):
    return UserFactory(username="outsider")


@pytest.fixture
def api(owner) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


@pytest.fixture
def outsider_api(outsider) -> APIClient:
    client = APIClient()
    client.force_authenticate(outsider)
    return client


@pytest.fixture
def anon_api() -> APIClient:
    return APIClient()


@pytest.fixture(autouse=True)
def _no_background_compaction(settings):
    """Background compaction runs in worker threads, which cannot see a test's uncommitted
    transaction; tests that exercise it turn it back on with `transactional_db`."""
    settings.CHAT_BACKGROUND_COMPACTION = False
