"""API tokens (DRF's authtoken: one key per user): issue, revoke, expire, rotate.

* `token_issue` is what POST /api/v1/auth/token hands out: the user's key, or a new one when
  there is none or it has passed API_TOKEN_MAX_AGE_SECONDS.
* `token_revoke` is DELETE /api/v1/auth/token.
* `ExpiringTokenAuthentication` refuses (401 `token_expired`) and deletes a key older than the
  maximum age, and answers every other bad key with 401 `token_invalid` instead of DRF's 403
  (our first authenticator is the session one, which has no WWW-Authenticate challenge, so DRF
  would downgrade the 401): a client can tell "log in again" from "not allowed".
* A password change, however it is made (the admin's form, `changepassword`, set_password +
  save, or a new hash assigned to `password`), deletes every key of that user: whoever knew
  the old password may have minted one (cadau/accounts.py notices it).
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, User
from django.db import connections, router
from django.utils import timezone
from rest_framework import exceptions, status
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.request import Request

from cadau.accounts import credentials_revoked
from cadau.dbconvert import field_converters, value_converted

# DRF's keys are 40 lower-case hex characters (Token.generate_key). Anything else is refused
# before it reaches the database (PostgreSQL rejects a NUL in a query parameter outright).
_KEY_RE = re.compile(r"[0-9a-f]{40}")


class TokenRejected(exceptions.APIException):
    """401 with a `WWW-Authenticate: Token` challenge. Not an AuthenticationFailed on purpose:
    DRF turns those into 403 when the first authenticator offers no challenge."""

    status_code = status.HTTP_401_UNAUTHORIZED
    default_detail = "Invalid token."
    default_code = "token_invalid"
    auth_header = "Token"


def _max_age() -> timedelta | None:
    seconds = int(getattr(settings, "API_TOKEN_MAX_AGE_SECONDS", 0))
    return timedelta(seconds=seconds) if seconds > 0 else None


def token_is_expired(*, token: Token) -> bool:
    max_age = _max_age()
    return max_age is not None and token.created + max_age <= timezone.now()


def token_issue(*, user: User) -> Token:
    """The user's key for a successful login; a fresh one replaces an expired key."""
    token, created = Token.objects.get_or_create(user=user)
    if not created and token_is_expired(token=token):
        token.delete()
        token = Token.objects.create(user=user)
    return token


def token_revoke(*, user: AbstractBaseUser | AnonymousUser) -> int:
    """Deletes the user's key(s); the number deleted (0 when there was none)."""
    if user.pk is None:
        return 0
    deleted, _ = Token.objects.filter(user_id=user.pk).delete()
    if deleted:
        # Event streams opened with the key end with it (chat/services/sockets.py).
        credentials_revoked.send(sender=Token, user_id=user.pk, reason="token")
    return deleted


class ExpiringTokenAuthentication(TokenAuthentication):
    def authenticate_header(self, request: Request) -> str | None:
        # Asked of the first authenticator when a request has no credentials at all: none, so
        # that stays `403 not_authenticated` (docs/api.md), as it was with the session's
        # authenticator first. A bad key still gets its challenge (TokenRejected).
        return None

    def authenticate(self, request: Request) -> tuple[Any, Token] | None:
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed as exc:
            raise TokenRejected(str(exc.detail)) from exc

    def authenticate_credentials(self, key: str) -> tuple[Any, Token]:
        if not _KEY_RE.fullmatch(key):
            raise TokenRejected()
        token = _token_with_user(key=key)
        if token is None:
            raise TokenRejected()
        if token_is_expired(token=token):
            token.delete()
            raise TokenRejected("Token expired: log in again.", code="token_expired")
        if not token.user.is_active:
            raise TokenRejected("User inactive or deleted.")
        return token.user, token


def _token_with_user(*, key: str) -> Token | None:
    """The key's Token with its user, in one statement whose SQL is written once: the ORM
    compiled `select_related("user").get(key=...)` again on every API request, ~0.27 ms of
    a REST send's way to its first token, ~0.10 now (docs/benchmarks.md)."""
    db = router.db_for_read(Token)
    connection = connections[db]
    user = next(
        iter(get_user_model()._default_manager.db_manager(db).raw(_token_sql(db), [key])), None
    )
    if user is None:
        return None
    # A column beside the model's comes back as the database gave it (SQLite: text): the
    # field's own converters, as the ORM's compiler applies them.
    col, converters = field_converters(connection, Token, Token._meta.get_field("created"))
    value = value_converted(getattr(user, _CREATED_AS), col, converters, connection)
    delattr(user, _CREATED_AS)
    token = Token(key=key, user=user, created=value)
    token._state.adding, token._state.db = False, db
    return token


_CREATED_AS = "cadau_token_created"


@functools.cache
def _token_sql(db: str) -> str:
    """The user's columns and the token's date, joined, for a key (a parameter)."""
    user_model = get_user_model()
    quote = connections[db].ops.quote_name
    users, tokens = quote(user_model._meta.db_table), quote(Token._meta.db_table)
    user_pk = quote(user_model._meta.pk.column)
    created = quote(Token._meta.get_field("created").column)
    # Only names from the models' meta are formatted in; the key is bound.
    return (
        f"SELECT {users}.*, {tokens}.{created} AS {quote(_CREATED_AS)}"  # noqa: S608
        f" FROM {tokens} INNER JOIN {users}"
        f" ON {tokens}.{quote(Token._meta.get_field('user').column)} = {users}.{user_pk}"
        f" WHERE {tokens}.{quote(Token._meta.pk.column)} = %s"
    )


# --- rotation on a password change ---------------------------------------------------------


def _tokens_delete_on_password(sender: Any, user_id: int, reason: str, **kwargs: Any) -> None:
    # Whoever knew the old password may have minted a key.
    if reason == "password":
        Token.objects.filter(user_id=user_id).delete()


def connect_signals() -> None:
    credentials_revoked.connect(_tokens_delete_on_password, dispatch_uid="cadau_token_rotate")
