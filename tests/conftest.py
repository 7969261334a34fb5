"""Shared fixtures: the two personas every access test uses, and API clients for them."""

from __future__ import annotations

import pytest
from asgiref.sync import SyncToAsync
from channels.testing import WebsocketCommunicator
from django.db import connections
from rest_framework.test import APIClient

from chat.rendered import rendered_forget
from chat.search.archive_window import archive_windows_forget
from chat.search.recall_warm import recall_warm_forget
from tests.factories import UserFactory
from tests.helpers import limits_clear, window_forget

# Area fixtures live in their own plugin modules so parallel work does not collide here.
pytest_plugins = ["tests.fixtures_llm", "tests.fixtures_real_llm"]


@pytest.fixture(scope="session", autouse=True)
def _worker_thread_connections_closed(django_db_setup, django_db_blocker):
    """Database work of sockets and replies runs in worker threads (asgiref's long-lived sync
    thread, event loops' thread pools) that keep their connections (DB_CONN_MAX_AGE). Close
    them before the test database is dropped: PostgreSQL refuses to drop a database someone
    is still connected to."""
    yield
    with django_db_blocker.unblock():
        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
        connection = connections["default"]
        if connection.vendor == "postgresql":
            # Threads of pools whose loops are gone may not have let go yet.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()


@pytest.fixture(scope="session", autouse=True)
def _refused_sockets_are_told_they_are_gone():
    """After an application closes a socket at the handshake, a server sends it
    `websocket.disconnect` (ASGI) and the consumer ends. Channels' communicator does not, so a
    refused socket's consumer went on receiving from the channel layer until the test's loop
    closed; on Redis that receive, cancelled at loop shutdown, never ended (redis-py retried
    the blocking read) and the whole run hung. The communicator now does what a server does."""
    original = WebsocketCommunicator.connect

    async def connect(self: WebsocketCommunicator, timeout: float = 1) -> tuple[bool, int | None]:
        connected, code = await original(self, timeout)
        if not connected:
            await self.disconnect(code=code or 1000, timeout=timeout)
        return connected, code

    WebsocketCommunicator.connect = connect
    yield
    WebsocketCommunicator.connect = original


@pytest.fixture(autouse=True)
def _rate_limits_reset():
    """Rate-limit counters and lockouts live in the cache, which outlives a test (this
    process's memory, or Redis): every test starts with full allowances."""
    limits_clear()
    yield


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
def _channel_layer_per_test():
    """channels-redis keeps receive state (locks, counts, pooled connections) for the loop that
    used it, and every async_to_sync call of a test runs its own loop: a layer left over from
    an earlier test's loop made the first streamed send of a later test hang at its loop's
    shutdown (PostgreSQL + Redis run). Each test gets a layer of its own, as each server
    process has."""
    from channels import DEFAULT_CHANNEL_LAYER
    from channels.layers import channel_layers

    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


@pytest.fixture(autouse=True)
def _no_background_compaction(settings):
    """Background compaction runs in worker threads, which cannot see a test's uncommitted
    transaction; tests that exercise it turn it back on with `transactional_db`."""
    settings.CHAT_BACKGROUND_COMPACTION = False


@pytest.fixture(autouse=True)
def _titles_without_a_model_call(settings):
    """A title call would take a scripted summary reply or count as a summary call; tests of
    titles (tests/chat/test_titles.py) turn the model back on."""
    settings.CHAT_AUTO_TITLE = "words"


@pytest.fixture(autouse=True)
def _no_learned_windows():
    """What a test's model server taught about its context window stays with that test."""
    window_forget()
    yield
    window_forget()


@pytest.fixture(autouse=True)
def _no_kept_archive_windows():
    """Recall's archive rows kept in this process (chat/search/archive_window.py), and the
    sessions found with none to read ahead (chat/search/recall_warm.py), are keyed by session
    id, and SQLite gives a rolled-back test's ids to the next test again; rendered replies
    (chat/rendered.py) likewise."""
    archive_windows_forget()
    recall_warm_forget()
    rendered_forget()
    yield
    archive_windows_forget()
    recall_warm_forget()
    rendered_forget()
