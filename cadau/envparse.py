"""Strict readers of environment variables for cadau/settings.py (the one settings module):
django-environ falls back silently on some malformed values ("maybe" is False, "12abc" may
raise a bare ValueError); these stop start-up with ImproperlyConfigured naming the variable."""

from __future__ import annotations

import math
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

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
