"""Strict readers of environment variables for cadau/settings.py (the one settings module):
django-environ falls back silently on some malformed values ("maybe" is False, "12abc" may
raise a bare ValueError); these stop start-up with ImproperlyConfigured naming the variable."""

from __future__ import annotations

import math
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from cadau.rates import rate_parse

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def env_strict(fn: Any, name: str, **kwargs: Any) -> Any:
    """`fn(name, **kwargs)` (an environ.Env reader), its parse errors named."""
    try:
        return fn(name, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from exc


def env_bool(env: environ.Env, name: str, *, default: bool) -> bool:
    """Strict: django-environ reads any unknown word ("maybe", "ture") as False."""
    raw = env.str(name, default="").strip().lower()
    if not raw:
        return default
    if raw in _TRUE | _FALSE:
        return raw in _TRUE
    raise ImproperlyConfigured(f"{name}: expected true or false, got {raw!r}")


def env_int(
    env: environ.Env, name: str, *, default: int, minimum: int = 0, maximum: int | None = None
) -> int:
    value: int = env_strict(env.int, name, default=default)
    if value < minimum:
        raise ImproperlyConfigured(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}: must be <= {maximum}, got {value}")
    return value


def env_float(
    env: environ.Env, name: str, *, default: float, minimum: float = 0.0, above: bool = False
) -> float:
    """A finite number >= `minimum` (> it with `above`): a negative timeout made every model
    call fail at once, "nan" compared false with every limit."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum or (above and value == minimum):
        bound = f"> {minimum:g}" if above else f">= {minimum:g}"
        raise ImproperlyConfigured(f"{name}: must be a number {bound}, got {raw!r}")
    return value


def env_rates(env: environ.Env, defaults: dict[str, str]) -> dict[str, str]:
    """Each scope's rate from THROTTLE_<SCOPE> (cadau/rates.py's syntax), else its default."""
    out = {}
    for scope, default in defaults.items():
        name = f"THROTTLE_{scope.upper()}"
        value = env.str(name, default=default).strip().lower()
        try:
            rate_parse(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from exc
        out[scope] = value
    return out


# A login session, a history cursor and a password reset are signed with SECRET_KEY: a short
# one can be guessed. Django's own check asks for as much, but only under `check --deploy`.
SECRET_KEY_MIN_CHARS = 50


def settings_coherent(
    *,
    secret_key: str,
    allowed_hosts: list[str],
    debug: bool,
    max_message_runes: int,
    max_body_bytes: int,
    max_frame_bytes: int,
) -> None:
    """ImproperlyConfigured for values that parse but that the app could not honour: each
    started a server that then failed its users (a probe)."""
    if len(secret_key) < SECRET_KEY_MIN_CHARS:
        raise ImproperlyConfigured(
            f"SECRET_KEY: must be at least {SECRET_KEY_MIN_CHARS} characters, got "
            f"{len(secret_key)}; make one with: "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    if not allowed_hosts and not debug:
        # Django would start, then answer every request 400 (DEBUG alone lets localhost in).
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS: empty, so every request would be refused; name the host(s) the "
            "app is reached by"
        )
    if min(max_body_bytes, max_frame_bytes) < max_message_runes:
        # Every character takes a byte at least: the operator would see 413s and frame
        # refusals, not the limit they asked for.
        raise ImproperlyConfigured(
            f"CHAT_MAX_MESSAGE_RUNES: {max_message_runes} is more than a request can carry "
            f"(HTTP_MAX_BODY_BYTES {max_body_bytes}, WS_MAX_FRAME_BYTES {max_frame_bytes}); "
            "raise those too"
        )
