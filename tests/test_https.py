"""HTTPS settings from the environment (cadau/settings.py) and `manage.py check --deploy` under
the documented production settings (docs/production.env, which README shows)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_ENV = ROOT / "docs" / "production.env"

SECURE = (
    "s.SECURE_PROXY_SSL_HEADER, s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, "
    "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS"
)


def _child_env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "BEHIND_"))}
    return {**base, "SECRET_KEY": secrets.token_urlsafe(50), **env}


def _settings(env: dict[str, str], expr: str = SECURE) -> str:
    code = f"import cadau.settings as s; print(repr(({expr},)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_child_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def production_env() -> dict[str, str]:
    """The documented production settings: `NAME=value` lines of docs/production.env."""
    env = {}
    for line in PRODUCTION_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def test_https_is_off_without_a_declared_proxy():
    assert _settings({"DEBUG": "false"}) == "(None, False, False, False, 0, False)"


def test_https_is_on_by_default_behind_a_declared_tls_proxy():
    assert _settings({"DEBUG": "false", "BEHIND_TLS_PROXY": "true"}) == (
        "(('HTTP_X_FORWARDED_PROTO', 'https'), True, True, True, 31536000, True)"
    )


def test_debug_keeps_redirects_cookies_and_hsts_off_behind_a_proxy():
    # A developer's proxy on localhost must not pin HSTS into their browser for a year.
    assert _settings({"DEBUG": "true", "BEHIND_TLS_PROXY": "true"}) == (
        "(('HTTP_X_FORWARDED_PROTO', 'https'), False, False, False, 0, False)"
    )


def test_each_setting_can_be_overridden():
    env = {
        "DEBUG": "false",
        "BEHIND_TLS_PROXY": "true",
        "SECURE_HSTS_SECONDS": "600",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "false",
        "SECURE_SSL_REDIRECT": "false",
    }
    assert _settings(env) == (
        "(('HTTP_X_FORWARDED_PROTO', 'https'), False, True, True, 600, False)"
    )
    # TLS terminated by the app server itself: secure cookies and HSTS without a proxy header.
    direct = {"DEBUG": "false", "SESSION_COOKIE_SECURE": "true", "SECURE_HSTS_SECONDS": "60"}
    assert _settings(direct) == "(None, False, True, False, 60, True)"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BEHIND_TLS_PROXY", "maybe"),
        ("SECURE_HSTS_SECONDS", "a year"),
        ("SECURE_HSTS_SECONDS", "-1"),
        ("SECURE_SSL_REDIRECT", "sometimes"),
        ("SESSION_COOKIE_SECURE", "2"),
    ],
)
def test_bad_values_stop_start_up_naming_the_variable(name, value):
    done = subprocess.run(
        [sys.executable, "-c", "import cadau.settings"],
        env=_child_env({name: value}),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr


def test_check_deploy_is_clean_under_the_documented_production_settings():
    env = production_env()
    assert env["DEBUG"] == "false" and env["BEHIND_TLS_PROXY"] == "true"
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=_child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


@pytest.mark.django_db
def test_behind_the_proxy_plain_http_redirects_and_https_gets_hsts(settings):
    # The values the production settings produce, applied to this process's settings.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SESSION_COOKIE_SECURE = True
    settings.CSRF_COOKIE_SECURE = True
    client = Client()
    plain = client.get("/accounts/login/")
    assert plain.status_code == 301
    assert plain["Location"] == "https://testserver/accounts/login/"
    secure = client.get("/accounts/login/", headers={"x-forwarded-proto": "https"})
    assert secure.status_code == 200
    assert secure["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert secure.cookies["csrftoken"]["secure"] is True
