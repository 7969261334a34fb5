"""The one settings module. Everything that differs between deployments comes from the
environment (or the git-ignored `.env.local` that `make run` writes), parsed strictly: a bad
value stops start-up with ImproperlyConfigured naming the variable."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from cadau.contextconfig import load_chat_context

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Real environment variables win over the local file (read_env only sets missing keys).
_local_env = BASE_DIR / ".env.local"
if _local_env.is_file():
    env.read_env(str(_local_env))


def _strict(fn: Any, name: str, **kwargs: Any) -> Any:
    """django-environ falls back silently on some malformed values; we want a named error."""
    try:
        return fn(name, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from exc


SECRET_KEY: str = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is not set. `make run` writes one into .env.local; in production set it in "
        "the environment."
    )
DEBUG: bool = _strict(env.bool, "DEBUG", default=False)
ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "chat",
    "agentmemory",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "chat.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Only the benchmark sets CADAU_URLCONF (bench.urls: the app plus an OFFSET-paged comparison route).
ROOT_URLCONF = env.str("CADAU_URLCONF", default="cadau.urls")
ASGI_APPLICATION = "cadau.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: SQLite embedded default, DATABASE_URL for PostgreSQL -------------------------
DATABASES = {
    "default": _strict(env.db_url, "DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE transactions take the write lock up front, so two writers queue on the busy
    # timeout instead of failing with "database is locked" on lock upgrade; WAL lets readers
    # (history pages) proceed while a reply is being written.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file (not :memory:) so worker threads and test servers share the test database; one per
    # process so concurrent test runs on one machine never share it.
    DATABASES["default"].setdefault("TEST", {})["NAME"] = str(
        Path(tempfile.gettempdir()) / f"cadau-test-{os.getpid()}.sqlite3"
    )
# Persistent connections: the WebSocket path runs its database work in one long-lived thread
# (Channels' database_sync_to_async), and opening a connection per call cost a SQLite send
# ~2 ms per trip (open, register Django's functions, WAL checkpoint on close) or a PostgreSQL
# backend start; bench/realtime.py. Threads that end (one per HTTP request under ASGI) take
# their connection with them. Health checks replace a connection the server dropped.
DATABASES["default"]["CONN_MAX_AGE"] = _strict(env.int, "DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels: in-memory layer unless REDIS_URL is set ----------------------------------------
REDIS_URL: str = env.str("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py's pool refuses (MaxConnectionsError) past 100 commands in flight; a
                # burst of a few hundred sockets connecting at once needs more.
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "max_connections": _strict(env.int, "REDIS_MAX_CONNECTIONS", default=1000),
                    }
                ],
                "prefix": env.str("REDIS_PREFIX", default="cadau"),
            },
        }
    }
else:
    # Channels' in-memory layer with its expiry sweep throttled (see chat/layers.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "chat.layers.InMemoryChannelLayer"}}

# --- Auth ---------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- i18n -----------------------------------------------------------------------------------
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
USE_I18N = True
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_TZ = True

# --- Static files: served by the app itself (whitenoise), no CDN -----------------------------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The app serves static files from its own folders (WHITENOISE_USE_FINDERS); STATIC_ROOT is only
# for a deployment that runs collectstatic (whitenoise warns at start-up if it points nowhere).
STATIC_ROOT: str | None = env.str("STATIC_ROOT", default="") or None

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "chat.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Cadau API",
    "DESCRIPTION": "Chat sessions, paged history, rolling model context and agent memory.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Cadau ----------------------------------------------------------------------------------
RUNTIME_DIR = Path(env.str("RUNTIME_DIR", default=str(BASE_DIR / "runtime"))).resolve()
# Agent memory files: "" = files under RUNTIME_DIR; or a STORAGES alias / dotted Storage path.
AGENT_MEMORY_STORAGE: str = env.str("AGENT_MEMORY_STORAGE", default="")
# Extra agent tools: dotted paths to chat.tools.Tool objects (see chat/tools.py). An agent gets
# them only when its config_json "tools" list names them; built-ins are on by default.
AGENT_TOOLS: list[str] = env.list("AGENT_TOOLS", default=[])

LLM_BASE_URL: str = env.str("LLM_BASE_URL", default="").rstrip("/")
LLM_API_KEY: str = env.str("LLM_API_KEY", default="")
LLM_MODEL: str = env.str("LLM_MODEL", default="")
LLM_SUMMARY_MODEL: str = env.str("LLM_SUMMARY_MODEL", default="") or LLM_MODEL
LLM_TIMEOUT_SECONDS: float = _strict(env.float, "LLM_TIMEOUT_SECONDS", default=60.0)
LLM_CONNECT_TIMEOUT_SECONDS: float = _strict(env.float, "LLM_CONNECT_TIMEOUT_SECONDS", default=10.0)
LLM_MAX_RETRIES: int = _strict(env.int, "LLM_MAX_RETRIES", default=2)
# First retry waits this long, doubling (with jitter) up to 8 s; Retry-After wins when small.
LLM_RETRY_BACKOFF_SECONDS: float = _strict(env.float, "LLM_RETRY_BACKOFF_SECONDS", default=0.5)
if LLM_BASE_URL and not LLM_BASE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured("LLM_BASE_URL must start with http:// or https://")

# A send that arrives while the session's previous reply is still generating waits this long
# for it (a queue of one) before it is refused with `reply_in_progress`.
CHAT_SEND_QUEUE_SECONDS: float = _strict(env.float, "CHAT_SEND_QUEUE_SECONDS", default=30.0)
# After a reply, compact in a background thread when the next turn would cross the threshold.
CHAT_BACKGROUND_COMPACTION: bool = _strict(env.bool, "CHAT_BACKGROUND_COMPACTION", default=True)

# Rolling-context knobs: environment, then the `chat_context` section of CADAU_CONFIG (the
# seed's mindlink.json), which overrides the environment as the seed specifies.
CADAU_CONFIG: str = env.str("CADAU_CONFIG", default="")
CHAT_CONTEXT = load_chat_context(environ=env.ENVIRON, config_path=CADAU_CONFIG or None)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# Serve straight from the app's static folders (no collectstatic step, same in every deployment).
WHITENOISE_USE_FINDERS = True
