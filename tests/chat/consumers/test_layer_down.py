"""The channel layer (Redis) failing under open and opening sockets: no socket's bookkeeping
is left behind (a user refused 4429 after an outage), sockets stay open on their own
process's events and rejoin their groups when the layer is back, and the log says so once."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.conf import settings as django_settings

from chat.layers import InMemoryChannelLayer, _Outage
from chat.services import sockets
from tests.chat.consumers.helpers import TIMEOUT
from tests.chat.wsclient import closed_with
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The outage is played by the in-memory layer's methods failing; `python -m bench faults`
    # stops a real Redis.
    pytest.mark.skipif(
        bool(django_settings.REDIS_URL), reason="plays the outage on the in-memory layer"
    ),
]


@pytest.fixture(autouse=True)
def _outage_forgotten(monkeypatch):
    monkeypatch.setattr(_Outage, "down", False)


def _failing(monkeypatch, *names: str, times: int) -> list[int]:
    """The layer is down for its next `times` calls of `names` (each raises ConnectionError);
    returns the count of calls."""
    calls = [0]
    for name in names:
        real = getattr(InMemoryChannelLayer, name)

        def flaky(real=real):
            async def call(self, *args, **kwargs):
                calls[0] += 1
                if calls[0] <= times:
                    raise ConnectionError("Error 111 connecting to 127.0.0.1:6379.")
                return await real(self, *args, **kwargs)

            return call

        monkeypatch.setattr(InMemoryChannelLayer, name, flaky())
    return calls


async def test_sockets_opened_while_the_layer_is_down_leave_no_count_behind(
    session, owner_cookie, settings, monkeypatch
):
    settings.CHAT_MAX_SOCKETS_PER_USER = 2
    _failing(monkeypatch, "group_add", "group_discard", times=1000)
    for _ in range(4):  # twice the cap, one after another
        ws = await _open(session.pk, owner_cookie)
        await ws.disconnect()
    assert not sockets._open


async def test_a_socket_outlives_a_layer_outage_and_rejoins_its_group(
    session, owner_cookie, fake_llm, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="chat.realtime")
    monkeypatch.setattr("chat.layers.RETRY_FIRST_SECONDS", 0.01)
    calls = _failing(monkeypatch, "receive", "group_add", times=6)
    ws = await _open(session.pk, owner_cookie)
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while calls[0] < 8 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert calls[0] >= 8  # the link kept trying, joined again and reads again
    # Back: the client is asked to reconnect, and catch up on what it missed meanwhile.
    code, _before = await closed_with(ws)
    assert code == 4012
    ws = await _open(session.pk, owner_cookie)
    fake_llm.script("still here")
    await ws.send_json_to({"type": "send", "content": "hello?"})
    assert (await _until(ws, "done"))[-1]["message"]["content"] == "still here"
    await ws.disconnect()
    said = [r.getMessage() for r in caplog.records]
    assert sum("chat_layer_unavailable" in m for m in said) == 1
    assert sum("chat_layer_back" in m for m in said) == 1
