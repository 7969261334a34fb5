"""API tokens: revoke (DELETE /api/v1/auth/token), rotation on a password change however it is
made, and the optional maximum age (API_TOKEN_MAX_AGE_SECONDS)."""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cadau.tokens import ExpiringTokenAuthentication
from tests.factories import UserFactory
from tests.test_https import _child_env

TOKEN = "/api/v1/auth/token"
SESSIONS = "/api/v1/chat/sessions"
PASSWORD = "pw-for-tests-1"  # UserFactory's

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    # Every login here hashes a password; the default PBKDF2 rounds cost ~0.3 s each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _login(username: str = "owner", password: str = PASSWORD) -> str:
    response = APIClient().post(TOKEN, {"username": username, "password": password}, format="json")
    assert response.status_code == 200, response.content
    return str(response.json()["token"])


def _with(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code


# --- revoke ------------------------------------------------------------------------------------


def test_delete_revokes_the_calling_token(owner):
    token = _login()
    client = _with(token)
    assert client.get(SESSIONS).status_code == 200
    response = client.delete(TOKEN)
    assert response.status_code == 204 and response.content == b""
    assert not Token.objects.filter(key=token).exists()
    refused = client.get(SESSIONS)
    _error(refused, 401, "token_invalid")
    assert refused["WWW-Authenticate"] == "Token"
    # Revoking twice: the token is gone, so the caller is not authenticated any more.
    _error(client.delete(TOKEN), 401, "token_invalid")
    # Logging in again issues a new key.
    assert _login() != token


def test_delete_needs_authentication(anon_api):
    _error(anon_api.delete(TOKEN), 403, "not_authenticated")


def test_delete_with_a_browser_session_revokes_that_users_token(owner):
    token = _login()
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    # Session auth keeps its CSRF check: a cross-site page cannot revoke the token.
    _error(client.delete(TOKEN), 403, "permission_denied")
    client.get("/accounts/login/")  # sets the csrftoken cookie
    csrf = client.cookies["csrftoken"].value
    assert client.delete(TOKEN, HTTP_X_CSRFTOKEN=csrf).status_code == 204
    assert not Token.objects.filter(key=token).exists()


def test_post_still_ignores_a_session_cookie_without_csrf(owner):
    # Scripts that happen to carry a session cookie log in without a CSRF token, as before.
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(TOKEN, {"username": "owner", "password": PASSWORD}, format="json")
    assert response.status_code == 200


@pytest.mark.parametrize("method", ["get", "put", "patch"])
def test_other_methods_are_405_in_the_error_shape(owner, method):
    token = _login()
    response = getattr(_with(token), method)(TOKEN, {"username": "owner"}, format="json")
    _error(response, 405, "method_not_allowed")
    assert Token.objects.filter(key=token).exists()


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"token": "someone-elses"}', b"x" * 200_000],
)
def test_delete_ignores_whatever_body_it_is_sent(owner, body):
    token = _login()
    response = _with(token).generic("DELETE", TOKEN, body, content_type="application/json")
    assert response.status_code == 204
    assert not Token.objects.filter(key=token).exists()


def test_a_garbage_token_is_401(owner):
    for header in ["Token nope", "Token " + "x" * 5000, "Token a b", "Token \u0000"]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = client.get(SESSIONS)
        assert response.status_code == 401, (header, response.content)
        assert response.json()["error"]["code"] in {"token_invalid", "authentication_failed"}


def test_a_bad_token_beside_a_session_cookie_is_401_not_a_csrf_403(owner):
    """A probe: the session's authenticator came first, so a script with a stale key and a
    browser's cookie got `403 permission_denied` (CSRF) for a POST, not the documented 401."""
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    response = client.post(SESSIONS, {"title": "x"}, format="json")
    _error(response, 401, "token_invalid")
    assert response["WWW-Authenticate"] == "Token"
    # A good key beside the cookie is the token's request: no CSRF token asked for.
    client.credentials(HTTP_AUTHORIZATION=f"Token {_login()}")
    assert client.post(SESSIONS, {"title": "x"}, format="json").status_code == 201
    # No credentials at all: still 403 not_authenticated, without a challenge.
    response = APIClient().get(SESSIONS)
    _error(response, 403, "not_authenticated")
    assert "WWW-Authenticate" not in response


# --- rotation on a password change -------------------------------------------------------------


def test_set_password_and_save_revokes_every_token(owner):
    token = _login()
    owner.set_password("another-pw-42")
    owner.save()
    assert not Token.objects.filter(user=owner).exists()
    _error(_with(token).get(SESSIONS), 401, "token_invalid")
    assert _login(password="another-pw-42") != token


def test_assigning_a_new_hash_directly_revokes_tokens(owner):
    _login()
    owner.password = make_password("hashed-elsewhere-42")
    owner.save()
    assert not Token.objects.filter(user=owner).exists()


def test_saving_the_user_without_a_password_change_keeps_the_token(owner):
    token = _login()
    owner.first_name = "Renamed"
    owner.save()
    owner.last_login = timezone.now()
    owner.save(update_fields=["last_login"])
    # Logging in through the form saves last_login too.
    assert Client().login(username="owner", password=PASSWORD)
    assert Token.objects.filter(key=token).exists()
    assert _with(token).get(SESSIONS).status_code == 200


def test_changepassword_command_revokes_tokens(owner, monkeypatch):
    _login()
    monkeypatch.setattr("getpass.getpass", lambda prompt="": "command-pw-42x")
    call_command("changepassword", "owner", stdout=io.StringIO())
    assert not Token.objects.filter(user=owner).exists()


def test_admin_password_form_revokes_tokens(owner):
    _login()
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    response = client.post(
        f"/admin/auth/user/{owner.pk}/password/",
        {"password1": "admin-set-pw-42", "password2": "admin-set-pw-42", "usable_password": "true"},
    )
    assert response.status_code == 302, response.content[:2000]
    owner.refresh_from_db()
    assert owner.check_password("admin-set-pw-42")
    assert not Token.objects.filter(user=owner).exists()


def test_other_users_tokens_survive(owner, outsider):
    theirs = _login("outsider")
    owner.set_password("another-pw-42")
    owner.save()
    assert Token.objects.filter(key=theirs).exists()


# --- maximum age -------------------------------------------------------------------------------


def _age(token: str, seconds: float) -> None:
    Token.objects.filter(key=token).update(created=timezone.now() - timedelta(seconds=seconds))


def test_no_maximum_age_by_default(owner, settings):
    assert settings.API_TOKEN_MAX_AGE_SECONDS == 0
    token = _login()
    _age(token, 10 * 365 * 86400)
    assert _with(token).get(SESSIONS).status_code == 200


def test_an_expired_token_is_refused_with_401_and_deleted(owner, settings):
    settings.API_TOKEN_MAX_AGE_SECONDS = 3600
    token = _login()
    _age(token, 3599)
    assert _with(token).get(SESSIONS).status_code == 200
    _age(token, 3601)
    response = _with(token).get(SESSIONS)
    _error(response, 401, "token_expired")
    assert response["WWW-Authenticate"] == "Token"
    assert not Token.objects.filter(key=token).exists()


def test_login_replaces_an_expired_token(owner, settings):
    settings.API_TOKEN_MAX_AGE_SECONDS = 3600
    token = _login()
    assert _login() == token  # still fresh: the same key, as before
    _age(token, 7200)
    fresh = _login()
    assert fresh != token
    assert _with(fresh).get(SESSIONS).status_code == 200


def test_inactive_users_token_is_refused(owner):
    token = _login()
    get_user_model().objects.filter(pk=owner.pk).update(is_active=False)
    _error(_with(token).get(SESSIONS), 401, "token_invalid")


def test_a_key_is_read_with_its_user_in_one_statement(owner, django_assert_num_queries):
    """The lookup is SQL of its own (cadau/tokens.py): what it gives is what the ORM reads."""
    key = _login()
    stored = Token.objects.select_related("user").get(key=key)
    with django_assert_num_queries(1):
        user, token = ExpiringTokenAuthentication().authenticate_credentials(key)
    assert (token.key, token.user_id, token.created) == (key, owner.pk, stored.created)
    assert token.created.tzinfo is not None
    fields = [f.attname for f in get_user_model()._meta.concrete_fields]
    assert [getattr(user, f) for f in fields] == [getattr(stored.user, f) for f in fields]
    assert not hasattr(user, "cadau_token_created")
    assert token.user is user


@pytest.mark.parametrize("value", ["-1", "soon", "1.5"])
def test_bad_max_age_stops_start_up(value):
    done = subprocess.run(
        [sys.executable, "-c", "import cadau.settings"],
        env=_child_env({"API_TOKEN_MAX_AGE_SECONDS": value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: API_TOKEN_MAX_AGE_SECONDS" in done.stderr
