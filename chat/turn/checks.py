"""A send's checks, in one order for REST and the WebSocket so both refuse the same input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils.crypto import constant_time_compare

from cadau.limits import limit_hit
from chat.context import SystemPrompt, context_check_fits, system_prompt_load
from chat.errors import InvalidInput, LoginEnded, MessageTooLarge, Throttled
from chat.models import ChatSession
from chat.selectors import session_for_user
from chat.text import text_problem

MAX_CLIENT_ID = 64


def validate_content(*, content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("content must be a non-empty string")
    problem = text_problem(content)
    if problem:
        raise InvalidInput(f"content {problem}")
    limit = settings.CHAT_MAX_MESSAGE_RUNES
    if len(content) > limit:
        raise MessageTooLarge(f"content has {len(content)} characters; the limit is {limit}")
    return content


def validate_client_id(*, client_id: Any) -> str | None:
    if client_id is None or client_id == "":
        return None
    if (
        not isinstance(client_id, str)
        or len(client_id) > MAX_CLIENT_ID
        or text_problem(client_id) is not None
    ):
        raise InvalidInput(
            f"client_id must be a string of at most {MAX_CLIENT_ID} characters", code="bad_request"
        )
    return client_id


@dataclass(frozen=True, slots=True)
class SendRequest:
    """A send as an adapter received it; checked under the session's lock when stored."""

    user: Any
    session_id: Any
    content: Any
    client_id: Any
    # The socket's login: the session auth hash it was opened with (None: not a socket).
    login_hash: str | None = None


@dataclass(frozen=True, slots=True)
class CheckedSend:
    session: ChatSession
    content: str
    client_id: str | None
    # Loaded for the size check, and reused for the reply's payload.
    prompt: SystemPrompt


def send_rate_check(*, user: Any) -> None:
    """Count a send (or a regenerate) against the user's `chat_send` rate, REST and WebSocket
    alike; Throttled with the seconds to wait past it."""
    if user is None or not user.is_authenticated:
        return  # refused as not found next; nothing to count against
    wait = limit_hit(scope="chat_send", ident=f"user:{user.pk}")
    if wait is not None:
        raise Throttled(
            f"You are sending faster than this server allows; try again in {wait} s.",
            retry_after=wait,
        )


def send_checked(*, send: SendRequest) -> CheckedSend:
    """The session (NotFound for someone else's), the content, the client_id, then whether the
    message could ever fit the model's context. Outside the store's transaction on purpose: on
    SQLite a transaction holds the whole database's write lock, and a burst of sends queued on
    it (with SQLite's sleeping busy handler) for every millisecond of checking done inside."""
    session = session_for_user(user=send.user, session_id=send.session_id)
    if send.login_hash is not None and not login_hash_current(
        user=session.owner, login_hash=send.login_hash
    ):
        raise LoginEnded()
    content = validate_content(content=send.content)
    client_id = validate_client_id(client_id=send.client_id)
    prompt = system_prompt_load(session=session)
    context_check_fits(session=session, prompt=prompt, content=content)
    return CheckedSend(session=session, content=content, client_id=client_id, prompt=prompt)


def login_hash_current(*, user: Any, login_hash: str) -> bool:
    """Whether a login made with `login_hash` (Django's session auth hash) still stands for
    `user`, as Django's own get_user decides it (SECRET_KEY_FALLBACKS too): a password
    changed since ends it. Checked on a socket's every send, for free (the session's read
    loads its owner): a password changed in another process closes the user's sockets only
    through a channel layer the processes share."""
    if constant_time_compare(login_hash, user.get_session_auth_hash()):
        return True
    return any(
        constant_time_compare(login_hash, user._get_session_auth_hash(secret=secret))
        for secret in settings.SECRET_KEY_FALLBACKS
    )
