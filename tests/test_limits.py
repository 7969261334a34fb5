"""Rate limits (cadau/limits.py, chat/api/throttles.py) and the login lockout (cadau/logins.py).

Every limit answers 429 with Retry-After; API routes in the JSON error shape. Counters live in
the default cache: Redis when REDIS_URL is set (shared by every process), else local memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.cache import caches
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cadau import limits, rates
from tests.factories import AgentFactory, ChatSessionFactory, UserFactory

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "/api/v1/auth/token"
SESSIONS = "/api/v1/chat/sessions"
AGENTS = "/api/v1/agents"
LOGIN = "/accounts/login/"
PASSWORD = "pw-for-tests-1"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def clock(monkeypatch):
    """Moves the limiter's clock (windows and lockout expiry are computed from it)."""

    class Clock:
        now = 1_000_000.0

        def advance(self, seconds: float) -> None:
            self.now += seconds

    c = Clock()
    monkeypatch.setattr(limits, "_now", lambda: c.now)
    return c


def _token_post(username: str, password: str, ip: str = "10.0.0.1"):
    return APIClient().post(
        TOKEN, {"username": username, "password": password}, format="json", REMOTE_ADDR=ip
    )


def _form_post(username: str, password: str, ip: str = "10.0.0.1", path: str = LOGIN):
    return Client(REMOTE_ADDR=ip).post(path, {"username": username, "password": password})


def _assert_429(response, code: str | None = "throttled") -> int:
    assert response.status_code == 429, response.content[:500]
    retry_after = int(response["Retry-After"])
    assert retry_after >= 1
    if code is not None:
        body = response.json()
        assert body["error"]["code"] == code and body["error"]["message"]
    return retry_after


# --- settings ----------------------------------------------------------------------------------


def test_rate_parsing():
    assert rates.rate_parse("20/min") == rates.Rate(20, 60)
    assert rates.rate_parse("5/s") == rates.Rate(5, 1)
    assert rates.rate_parse("100/hour") == rates.Rate(100, 3600)
    assert rates.rate_parse("1000/day") == rates.Rate(1000, 86400)
    assert rates.rate_parse("off") is None
    for bad in ["", "20", "20/fortnight", "-1/min", "0/min", "x/min", "20/ min", "20/m/s"]:
        with pytest.raises(ValueError):
            rates.rate_parse(bad)


def _child(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("THROTTLE_", "LOGIN_"))}
    full.update({"SECRET_KEY": "x" * 50, **env})
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_defaults_and_overrides_from_the_environment():
    code = (
        "import cadau.settings as s; "
        "print(sorted(s.RATE_LIMITS.items()), s.LOGIN_FAILURE_LIMIT, s.LOGIN_LOCKOUT_SECONDS)"
    )
    done = _child({}, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "[('agent_create', '10/min'), ('api_read', '600/min'), ('api_write', '120/min'), "
        "('chat_send', '30/min'), ('context_read', '120/min'), "
        "('login_ip', '20/min'), ('login_username', '10/min'), "
        "('memory_entry_create', '30/min'), ('message_search', '120/min'), "
        "('recall_warm', '30/min'), ('session_compact', '10/min'), ('session_create', '30/min'), "
        "('session_export', '10/min'), ('session_update', '30/min')] 5 900"
    )
    done = _child({"THROTTLE_SESSION_CREATE": "off", "THROTTLE_LOGIN_IP": "3/s"}, code)
    assert "('session_create', 'off')" in done.stdout and "('login_ip', '3/s')" in done.stdout


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("THROTTLE_LOGIN_IP", "lots"),
        ("THROTTLE_SESSION_CREATE", "0/min"),
        ("LOGIN_FAILURE_LIMIT", "-1"),
        ("LOGIN_LOCKOUT_SECONDS", "0"),
        ("LOGIN_LOCKOUT_SECONDS", "15m"),
    ],
)
def test_bad_limits_stop_start_up(name, value):
    done = _child({name: value}, "import cadau.settings")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr


def test_cache_is_redis_when_redis_url_is_set_and_local_memory_otherwise():
    code = (
        "import cadau.settings as s; c = s.CACHES['default']; "
        "print(c['BACKEND'], c.get('KEY_PREFIX', ''))"
    )
    local = _child({"REDIS_URL": ""}, code)
    assert local.stdout.split() == ["django.core.cache.backends.locmem.LocMemCache"]
    shared = _child({"REDIS_URL": "redis://127.0.0.1:6379/0", "REDIS_PREFIX": "acme"}, code)
    assert shared.stdout.split() == ["django.core.cache.backends.redis.RedisCache", "acme:cache"]


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (shared counters)")
def test_counters_are_shared_between_processes():
    # Another process spends the whole allowance; this one is then refused.
    rate = rates.Rate(3, 60)
    code = (
        "import django; django.setup(); from cadau import limits, rates; "
        "print([limits.limit_hit(scope='xproc', ident='one', rate=rates.Rate(3, 60)) "
        "for _ in range(3)])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "cadau.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[None, None, None]"
    assert limits.limit_hit(scope="xproc", ident="one", rate=rate) is not None


# --- the limiter -------------------------------------------------------------------------------


def test_fixed_window_counts_and_says_when_to_come_back(clock):
    rate = rates.Rate(3, 60)
    clock.now = 6_000_010.0  # 10 s into a 60 s window
    assert [limits.limit_hit(scope="t", ident="a", rate=rate) for _ in range(3)] == [None] * 3
    assert limits.limit_hit(scope="t", ident="a", rate=rate) == 50
    assert limits.limit_hit(scope="t", ident="b", rate=rate) is None  # another key
    clock.advance(50)
    assert limits.limit_hit(scope="t", ident="a", rate=rate) is None  # the next window
    assert limits.limit_hit(scope="t", ident="a", rate=None) is None  # "off"


# --- the token endpoint ------------------------------------------------------------------------


def test_token_endpoint_is_throttled_per_ip(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_ip": "5/min"}
    UserFactory(username="alice")
    for n in range(5):
        assert _token_post(f"nobody{n}", "wrong").status_code == 400
    _assert_429(_token_post("alice", PASSWORD))
    # Another address is not affected.
    assert _token_post("alice", PASSWORD, ip="10.0.0.2").status_code == 200


def test_an_ipv6_client_is_counted_by_its_64_network(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_ip": "3/min"}
    settings.LOGIN_FAILURE_LIMIT = 2
    UserFactory(username="alice")
    # Whoever holds a /64 holds 2^64 addresses: a new one per guess dodges nothing.
    for n in range(3):
        assert _token_post(f"nobody{n}", "wrong", ip=f"2001:db8:1:2::{n + 1}").status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="2001:db8:1:2:ffff::9"))
    assert _token_post("alice", PASSWORD, ip="2001:db8:1:3::1").status_code == 200
    # The lockout of a (username, address) pair too; an IPv4-mapped address is its IPv4 one.
    for ip in ("2001:db8:5:6::1", "2001:db8:5:6::2"):
        assert _token_post("alice", "wrong", ip=ip).status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="2001:db8:5:6:a::b"), "login_locked")
    for ip in ("10.4.0.1", "::ffff:10.4.0.1"):
        assert _token_post("alice", "wrong", ip=ip).status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="10.4.0.1"), "login_locked")


def test_token_endpoint_is_throttled_per_username_across_addresses(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": "4/min"}
    UserFactory(username="alice")
    for n in range(4):
        assert _token_post("alice", "wrong", ip=f"10.1.0.{n}").status_code == 400
    _assert_429(_token_post("Alice", PASSWORD, ip="10.1.0.9"))  # case does not dodge it
    assert _token_post("bob", "wrong", ip="10.1.0.9").status_code == 400


def test_a_stranger_cannot_lock_a_user_out_of_where_they_log_in_from(settings, clock):
    """A probe: 101 wrong passwords for carol from one address, most of them refused as
    locked out, still spent the username's budget that every address shares, and carol's
    right password from her own address got 429."""
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": "10/min", "login_ip": "off"}
    UserFactory(username="carol")
    assert _token_post("carol", PASSWORD, ip="10.0.0.1").status_code == 200  # her address
    clock.advance(60)
    answers = [_token_post("carol", "wrong", ip="10.6.6.6").status_code for _ in range(101)]
    assert answers.count(400) == settings.LOGIN_FAILURE_LIMIT  # then locked, not counted
    # Her own address: known, so the guessing elsewhere does not count against her.
    assert _token_post("carol", PASSWORD, ip="10.0.0.1").status_code == 200
    assert _form_post("carol", PASSWORD, ip="10.0.0.1").status_code == 302


def test_the_username_limit_still_holds_for_addresses_never_seen_for_that_user(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": "4/min", "login_ip": "off"}
    UserFactory(username="alice")
    assert _token_post("alice", PASSWORD, ip="10.0.0.1").status_code == 200
    clock.advance(60)  # that login counted: the next window
    for n in range(4):
        assert _token_post("alice", "wrong", ip=f"10.2.0.{n}").status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="10.2.0.9"))  # a new address: refused
    assert _token_post("alice", PASSWORD, ip="10.0.0.1").status_code == 200  # hers: not
    # Known for LOGIN_KNOWN_SECONDS only.
    clock.advance(settings.LOGIN_KNOWN_SECONDS + 60)
    for n in range(4):
        assert _token_post("alice", "wrong", ip=f"10.3.0.{n}").status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="10.0.0.1"))


def test_without_a_lockout_no_address_is_exempt_from_the_username_limit(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 0
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": "2/min", "login_ip": "off"}
    UserFactory(username="alice")
    assert _token_post("alice", PASSWORD, ip="10.0.0.1").status_code == 200
    assert _token_post("alice", "wrong", ip="10.0.0.1").status_code == 400
    _assert_429(_token_post("alice", PASSWORD, ip="10.0.0.1"))


def test_an_address_over_its_limit_does_not_spend_the_usernames(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_username": "3/min", "login_ip": "2/min"}
    UserFactory(username="alice")
    for _ in range(2):
        assert _token_post("alice", "wrong", ip="10.4.0.1").status_code == 400
    for _ in range(5):
        _assert_429(_token_post("alice", "wrong", ip="10.4.0.1"))
    assert _token_post("alice", PASSWORD, ip="10.4.0.2").status_code == 200  # 3rd of 3


def test_token_login_locks_out_after_failures_even_with_the_right_password(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_LOCKOUT_SECONDS = 600
    UserFactory(username="alice")
    for _ in range(3):
        assert _token_post("alice", "wrong").status_code == 400
    locked = _token_post("alice", PASSWORD)
    assert 590 <= _assert_429(locked, "login_locked") <= 600
    assert not Token.objects.exists()
    # The lockout is for this username from this address: elsewhere the right password works.
    assert _token_post("alice", PASSWORD, ip="10.9.9.9").status_code == 200
    clock.advance(601)
    assert _token_post("alice", PASSWORD).status_code == 200


def test_a_successful_login_resets_the_failure_count(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 3
    UserFactory(username="alice")
    for _ in range(2):
        _token_post("alice", "wrong")
    assert _token_post("alice", PASSWORD).status_code == 200
    for _ in range(2):
        assert _token_post("alice", "wrong").status_code == 400
    assert _token_post("alice", PASSWORD).status_code == 200


def test_lockout_is_shared_by_the_form_and_the_token_endpoint(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 3
    UserFactory(username="alice")
    assert _form_post("alice", "wrong").status_code == 200  # the form again, with an error
    assert _form_post("alice", "wrong").status_code == 200
    assert _token_post("alice", "wrong").status_code == 400
    _assert_429(_token_post("alice", PASSWORD), "login_locked")
    page = _form_post("alice", PASSWORD)
    _assert_429(page, code=None)
    assert page["Content-Type"].startswith("text/html")
    assert b"Too many failed logins" in page.content
    assert "_auth_user_id" not in page.wsgi_request.session


def test_form_login_is_throttled_per_ip(settings, clock):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login_ip": "3/min"}
    for n in range(3):
        assert _form_post(f"nobody{n}", "wrong").status_code == 200
    page = _form_post("someone", "wrong")
    _assert_429(page, code=None)
    # Showing the form is not an attempt.
    assert Client(REMOTE_ADDR="10.0.0.1").get(LOGIN).status_code == 200


def test_admin_login_is_guarded_too(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 2
    UserFactory(username="root", is_staff=True, is_superuser=True)
    admin_login = "/admin/login/"
    for _ in range(2):
        assert _form_post("root", "wrong", path=admin_login).status_code == 200
    _assert_429(_form_post("root", PASSWORD, path=admin_login), code=None)


def test_lockout_can_be_turned_off(settings, clock):
    settings.LOGIN_FAILURE_LIMIT = 0
    UserFactory(username="alice")
    for _ in range(8):
        _token_post("alice", "wrong")
    assert _token_post("alice", PASSWORD).status_code == 200


# --- per-user limits on creation --------------------------------------------------------------


def test_session_creation_is_throttled_per_user(settings, clock, api, outsider_api):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_create": "5/min"}
    for _ in range(5):
        assert api.post(SESSIONS, {}, format="json").status_code == 201
    _assert_429(api.post(SESSIONS, {}, format="json"))
    # Reading is not creating; another user has their own allowance.
    assert api.get(SESSIONS).status_code == 200
    assert outsider_api.post(SESSIONS, {}, format="json").status_code == 201
    clock.advance(60)
    assert api.post(SESSIONS, {}, format="json").status_code == 201


def test_agent_creation_is_throttled_per_user(settings, clock, api):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "agent_create": "2/min"}
    for n in range(2):
        assert api.post(AGENTS, {"name": f"a{n}"}, format="json").status_code == 201
    _assert_429(api.post(AGENTS, {"name": "a3"}, format="json"))
    assert api.get(AGENTS).status_code == 200


def test_title_changes_are_throttled_per_user(settings, clock, api, owner):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_update": "3/min"}
    session = ChatSessionFactory(owner=owner)
    path = f"{SESSIONS}/{session.pk}"
    for n in range(3):
        assert api.patch(path, {"title": f"t{n}"}, format="json").status_code == 200
    _assert_429(api.patch(path, {"title": "t3"}, format="json"))
    session.refresh_from_db()
    assert session.title == "t2"
    # Reading is not renaming.
    assert api.get(path).status_code == 200
    clock.advance(60)
    assert api.patch(path, {"title": "t4"}, format="json").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_compact_now_is_throttled_per_user(settings, clock, api, owner, fake_llm):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_compact": "2/min"}
    path = f"{SESSIONS}/{ChatSessionFactory(owner=owner).pk}/compact"
    for _ in range(2):
        assert api.post(path, {}, format="json").status_code == 200
    _assert_429(api.post(path, {}, format="json"))
    assert fake_llm.count() == 0


def test_memory_entry_creation_is_throttled_per_user(settings, clock, api, owner, tmp_path):
    settings.RUNTIME_DIR = tmp_path
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "memory_entry_create": "2/min"}
    path = f"{AGENTS}/{AgentFactory(owner=owner).pk}/memory/entries"
    for n in range(2):
        response = api.post(path, {"content": f"fact number {n} is distinct"}, format="json")
        assert response.status_code == 201, response.content[:300]
    _assert_429(api.post(path, {"content": "another fact"}, format="json"))
    assert len(api.get(path).json()["results"]) == 2


def test_off_means_unlimited(settings, clock, api):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_create": "off"}
    for _ in range(40):
        assert api.post(SESSIONS, {}, format="json").status_code == 201


# --- fuzz: the token endpoint with bad input still answers in the shape -----------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'"alice"',
        b'{"username": ["alice"], "password": {}}',
        b'{"username": null, "password": null}',
        b'{"username": "' + b"a" * 100_000 + b'", "password": "x"}',
        b'{"username": "\\u0000", "password": "\\u0000"}',
        b"\xff\xfe",
    ],
)
def test_token_endpoint_bad_bodies_are_4xx_json(body):
    response = APIClient().generic("POST", TOKEN, body, content_type="application/json")
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response.json()["error"]["code"]


def test_token_endpoint_form_encoded_and_wrong_type_bodies():
    client = APIClient()
    response = client.post(TOKEN, "username=a&password=b", content_type="text/plain")
    assert response.status_code == 415 and response.json()["error"]["code"]


def test_cache_in_tests_is_the_configured_one():
    expected = "RedisCache" if django_settings.REDIS_URL else "LocMemCache"
    assert type(caches["default"]).__name__ == expected


# --- the shared cache (Redis) down -------------------------------------------------------------

DEAD_REDIS = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        # Nothing listens on port 1: every command is refused at once.
        "LOCATION": "redis://127.0.0.1:1/0",
    }
}


@pytest.fixture
def shared_cache_down(settings, monkeypatch):
    settings.CACHES = DEAD_REDIS
    monkeypatch.setattr(limits, "_shared_down_until", 0.0)
    monkeypatch.setattr(limits, "_shared_down", False)
    yield
    limits._fallback.clear()


def test_with_redis_down_limits_count_per_process_and_say_so_once(
    shared_cache_down, settings, clock, api, caplog, monkeypatch
):
    """A Redis outage answered every rate-limited request with a 500: the limits now count
    in this process's memory, still answer 429 past the rate, and the log says it once."""
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "session_create": "3/min"}
    for _ in range(3):
        assert api.post(SESSIONS, {}, format="json").status_code == 201
    _assert_429(api.post(SESSIONS, {}, format="json"))
    # Past the pause between tries the shared cache is asked again, and fails again: still
    # one line for the whole outage.
    monkeypatch.setattr(limits, "_shared_down_until", 0.0)
    _assert_429(api.post(SESSIONS, {}, format="json"))
    said = [r for r in caplog.records if "limits_shared_cache_unavailable" in r.getMessage()]
    assert len(said) == 1


def test_with_redis_down_logins_and_their_lockout_still_answer(shared_cache_down, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    UserFactory(username="eve", password=PASSWORD)
    for _ in range(2):
        assert _token_post("eve", "wrong").status_code == 400
    _assert_429(_token_post("eve", PASSWORD), code="login_locked")


def test_when_redis_is_back_the_limits_are_shared_again(settings, monkeypatch, caplog):
    monkeypatch.setattr(limits, "_shared_down_until", 0.0)
    monkeypatch.setattr(limits, "_shared_down", True)
    assert limits.counter_bump(key="limit:test:back", timeout=60) == 1
    assert not limits._shared_down
    assert any("limits_shared_cache_back" in r.getMessage() for r in caplog.records)
