"""A reply streamed as server-sent events ends with the credentials that opened it, as a socket
does (tests/chat/test_revocation.py): within a second of a key's revocation, a password
change or a deactivation, with an `error` `credentials_revoked`; the reply itself goes on and
is stored. In this process the revocation's signal ends it at once; one made elsewhere (another
process, a queryset update no signal sees) is found by the process's watch of its streams."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from cadau.tokens import token_revoke
from tests.chat.wsclient import loop_left_clean  # noqa: F401 (autouse)
from tests.factories import ChatSessionFactory
from tests.helpers import reply_settled, sse_parse, token_stream_send

pytestmark = pytest.mark.django_db(transaction=True)

LONG = " ".join(f"w{i}" for i in range(400))  # ~8 s at 20 ms a token


def _revoke_signal(owner):
    token_revoke(user=owner)


def _revoke_elsewhere(owner):
    # As another process would look from here: the row is gone, no signal in this one.
    Token.objects.filter(user=owner).delete()


def _password_changed(owner):
    user = get_user_model().objects.get(pk=owner.pk)
    user.set_password("a-new-password-42")
    user.save()


def _deactivated_elsewhere(owner):
    get_user_model().objects.filter(pk=owner.pk).update(is_active=False)


@pytest.mark.parametrize(
    "revoke", [_revoke_signal, _revoke_elsewhere, _password_changed, _deactivated_elsewhere]
)
async def test_a_revocation_ends_the_event_stream_within_a_second(owner, fake_llm, revoke):
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    fake_llm.script({"content": LONG, "token_ms": 20})
    response = await database_sync_to_async(token_stream_send)(owner, session)
    assert response.status_code == 200
    body, revoked_at = b"", None
    async for chunk in response.streaming_content:
        body += chunk
        if revoked_at is None and b"event: delta" in body:
            await database_sync_to_async(revoke)(owner)
            revoked_at = time.monotonic()
    assert revoked_at is not None
    assert time.monotonic() - revoked_at < 1.5
    events = sse_parse(body.decode())
    assert events[-1] == {
        "type": "error",
        "code": "credentials_revoked",
        "message": events[-1]["message"],
    }
    assert not any(e["type"] == "done" for e in events)
    # The reply was not stopped: it is stored whole.
    reply = await reply_settled(session)
    assert reply.status == "complete" and reply.content == LONG
