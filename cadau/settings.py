"""The one settings module. Everything that differs between deployments comes from the
environment (or the git-ignored `.env.local` that `make run` writes), parsed strictly: a bad
value stops start-up with ImproperlyConfigured naming the variable."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from cadau.contextconfig import config_path_find, load_chat_context
from cadau.envparse import (
    env_bool,
    env_float,
    env_int,
    env_rates,
    env_strict,
    settings_coherent,
)
from cadau.rates import API_THROTTLE_CLASSES, RATE_DEFAULTS
from cadau.zones import zone_known

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Real environment variables win over the local file (read_env only sets missing keys).
_local_env = BASE_DIR / ".env.local"
if _local_env.is_file():
    env.read_env(str(_local_env))


# The strict readers (cadau/envparse.py), bound to this environment.
_strict = env_strict
_bool = functools.partial(env_bool, env)
_int = functools.partial(env_int, env)
_float = functools.partial(env_float, env)


SECRET_KEY: str = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is not set. `make run` writes one into .env.local; in production set it in "
        "the environment."
    )
DEBUG: bool = _bool("DEBUG", default=False)
ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# --- HTTPS ------------------------------------------------------------------------------------
# BEHIND_TLS_PROXY declares a TLS-terminating proxy in front that sets X-Forwarded-Proto (and
# overwrites whatever a client sent in it). Only then may the header be trusted: without a proxy
# any client could claim https. Declared and not DEBUG, HTTPS is on by default: redirect plain
# HTTP, secure-only cookies, HSTS. Each can still be set on its own, e.g. when the app server
# terminates TLS itself (no proxy: SESSION_COOKIE_SECURE=true, SECURE_HSTS_SECONDS=...).
BEHIND_TLS_PROXY: bool = _bool("BEHIND_TLS_PROXY", default=False)
SECURE_PROXY_SSL_HEADER: tuple[str, str] | None = (
    ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
)
_https_default = BEHIND_TLS_PROXY and not DEBUG
SECURE_SSL_REDIRECT: bool = _bool("SECURE_SSL_REDIRECT", default=_https_default)
# Paths (regexes, no leading slash) answered over plain HTTP too, e.g. a load balancer's probe.
SECURE_REDIRECT_EXEMPT: list[str] = env.list("SECURE_REDIRECT_EXEMPT", default=[])
SESSION_COOKIE_SECURE: bool = _bool("SESSION_COOKIE_SECURE", default=_https_default)
CSRF_COOKIE_SECURE: bool = _bool("CSRF_COOKIE_SECURE", default=_https_default)
# A year once on. HSTS is sticky in browsers: an operator unsure of their TLS set-up starts with
# a few minutes (SECURE_HSTS_SECONDS=300) and raises it.
SECURE_HSTS_SECONDS: int = _int("SECURE_HSTS_SECONDS", default=31_536_000 if _https_default else 0)
# Covers only names under the host that sends it (*.chat.example.com), not its parent domain.
SECURE_HSTS_INCLUDE_SUBDOMAINS: bool = _bool(
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", default=SECURE_HSTS_SECONDS > 0
)
SECURE_HSTS_PRELOAD: bool = _bool("SECURE_HSTS_PRELOAD", default=False)
# check --deploy asks for `preload` (W021). Joining the browsers' preload lists is a decision
# for whoever owns the registrable domain, not an app default, so that one check stays quiet
# until an operator opts in with SECURE_HSTS_PRELOAD=true.
SILENCED_SYSTEM_CHECKS: list[str] = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

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
    "cadau.apps.CadauConfig",
    "chat",
    "agentmemory",
    "devtools",
]

MIDDLEWARE = [
    # First: it sees a deferred response after every other middleware has (cadau/deferred.py).
    "cadau.deferred.DeferredResponseMiddleware",
    "chat.middleware.TurnForegroundMiddleware",  # early: background work gives way to a send
    "cadau.headrequests.HeadWithoutBodyMiddleware",  # a HEAD never starts a streamed body
    "cadau.compression.CompressionMiddleware",  # gzip, after the body is written; never streams
    "django.middleware.security.SecurityMiddleware",
    "chat.middleware.ContentSecurityPolicyMiddleware",
    "chat.middleware.StaticFilesMiddleware",
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
if DATABASES["default"].get("ENGINE") not in (
    "django.db.backends.sqlite3",
    "django.db.backends.postgresql",
):
    raise ImproperlyConfigured(
        "DATABASE_URL: expected sqlite:///PATH or postgres://..., got "
        f"{env.str('DATABASE_URL', default='')[:40]!r}"
    )
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
# (Channels' database_sync_to_async), and a connection per call costs every trip an open
# (SQLite: Django's functions registered, a WAL checkpoint on close; PostgreSQL: a backend
# start). Threads that end (one per HTTP request under ASGI) take their connection with them.
# Health checks replace a connection the server dropped.
DATABASES["default"]["CONN_MAX_AGE"] = _int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# PostgreSQL: a pool of connections per process (psycopg_pool). Django runs each HTTP request's
# sync code in a thread of its own under ASGI, so without a pool every request would start a
# PostgreSQL backend, milliseconds before a send could store anything.
DB_POOL: bool = _bool("DB_POOL", default=True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and DB_POOL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": _int("DB_POOL_MIN_SIZE", default=2),
        "max_size": _int("DB_POOL_MAX_SIZE", default=20, minimum=1),
        # A request waits this long for a free connection, then fails rather than hangs.
        "timeout": _float("DB_POOL_TIMEOUT_SECONDS", default=10.0, above=True),
    }
    # The pool keeps the connections; Django must hand each back after use.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels: in-memory layer unless REDIS_URL is set ----------------------------------------
REDIS_URL: str = env.str("REDIS_URL", default="")
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    # Else the server started, and its first request that counted a rate failed with a 500.
    raise ImproperlyConfigured(
        f"REDIS_URL: expected redis://, rediss:// or unix://..., got {REDIS_URL[:40]!r}"
    )
REDIS_PREFIX: str = env.str("REDIS_PREFIX", default="cadau")
# Messages one process's sockets may have waiting in the layer (channels-redis `capacity`),
# and how long a socket's group membership lasts without renewal (`group_expiry`).
CHANNEL_LAYER_CAPACITY: int = _int("CHANNEL_LAYER_CAPACITY", default=20_000, minimum=100)
CHANNEL_GROUP_EXPIRY_SECONDS: int = _int("CHANNEL_GROUP_EXPIRY_SECONDS", default=300, minimum=30)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py's pool refuses (MaxConnectionsError) past 100 commands in flight; a
                # burst of a few hundred sockets connecting at once needs more.
                # socket_timeout: redis-py 8 reads with a 5 s timeout by default, and a socket's
                # receive is a BZPOPMIN that blocks up to 5 s: every idle socket's consumer
                # died with "Timeout reading from" Redis. Longer than the blocking read, still
                # finite so a dead connection is noticed.
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "max_connections": _strict(env.int, "REDIS_MAX_CONNECTIONS", default=1000),
                        "socket_timeout": _strict(
                            env.float, "REDIS_SOCKET_TIMEOUT_SECONDS", default=30.0
                        ),
                    }
                ],
                "prefix": REDIS_PREFIX,
                # channels-redis drops what passes `capacity` (default 100, logged at INFO): 200
                # sockets watching other processes' replies lost events with no fault at all.
                # Live sockets renew their groups every third of `group_expiry` (chat/layers.py):
                # a killed process's channels leave them in minutes, not the default day.
                "capacity": CHANNEL_LAYER_CAPACITY,
                "group_expiry": CHANNEL_GROUP_EXPIRY_SECONDS,
            },
        }
    }
else:
    # Channels' in-memory layer with its expiry sweep throttled (see chat/layers.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "chat.layers.InMemoryChannelLayer"}}

# --- Cache: rate-limit counters and login lockouts --------------------------------------------
# Redis when REDIS_URL is set, so a limit holds across every server process; otherwise this
# process's memory (one process is all `make run` starts).
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"{REDIS_PREFIX}:cache",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Rate limits (cadau/limits.py) -------------------------------------------------------------


RATE_LIMITS: dict[str, str] = env_rates(env, RATE_DEFAULTS)  # THROTTLE_<SCOPE> each
# This many failed logins for one username from one address within LOGIN_LOCKOUT_SECONDS lock
# that pair out for LOGIN_LOCKOUT_SECONDS (cadau/logins.py); 0 turns the lockout off.
LOGIN_FAILURE_LIMIT: int = _int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_LOCKOUT_SECONDS: int = _int("LOGIN_LOCKOUT_SECONDS", default=900, minimum=1)
# An address a user logged in from, for this long: its logins skip the per-username rate
# (cadau/logins.py), so someone guessing the name elsewhere cannot lock them out there.
LOGIN_KNOWN_SECONDS: int = _int("LOGIN_KNOWN_SECONDS", default=30 * 24 * 3600, minimum=1)

# --- Auth ---------------------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    # Refuses a locked-out (username, address) pair before any password is hashed.
    "cadau.logins.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# API tokens live until revoked (DELETE /api/v1/auth/token) or the password changes; with a
# maximum age (seconds, 0 = none) an older token is refused with 401 and deleted.
API_TOKEN_MAX_AGE_SECONDS: int = _int("API_TOKEN_MAX_AGE_SECONDS", default=0)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- i18n -----------------------------------------------------------------------------------
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
# The language of pages for a browser that asks for none of LANGUAGES, and of the summary's
# heading when the summary itself says nothing (CHAT_SUMMARY_HEADING below).
LANGUAGE_CODE: str = env.str("LANGUAGE_CODE", default="en").strip().lower()
if LANGUAGE_CODE not in dict(LANGUAGES):
    raise ImproperlyConfigured(
        f"LANGUAGE_CODE: expected one of {', '.join(dict(LANGUAGES))}, got {LANGUAGE_CODE!r}"
    )
LOCALE_PATHS = [BASE_DIR / "locale"]
USE_I18N = True
# An IANA name (Asia/Shanghai). Stored times are UTC; this is the zone daily notes are dated
# in for agents without one of their own (agentmemory/clock.py), and the admin's display zone.
TIME_ZONE: str = env.str("TIME_ZONE", default="UTC").strip()
if not zone_known(TIME_ZONE):
    raise ImproperlyConfigured(f"TIME_ZONE: not an IANA time zone name: {TIME_ZONE[:100]!r}")
USE_TZ = True

# --- Static files: served by the app itself (whitenoise), no CDN -----------------------------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The app serves static files from its own folders (WHITENOISE_USE_FINDERS); STATIC_ROOT is only
# for a deployment that runs collectstatic (whitenoise warns at start-up if it points nowhere).
STATIC_ROOT: str | None = env.str("STATIC_ROOT", default="") or None

# --- Request size --------------------------------------------------------------------------
# Every HTTP body over this is refused with 413 before Django reads it (cadau/bodylimit.py),
# and every WebSocket frame over WS_MAX_FRAME_BYTES with a `bad_request` error. A message at
# CHAT_MAX_MESSAGE_RUNES characters, \u-escaped in JSON, fits in both.
CHAT_MAX_MESSAGE_RUNES: int = _int("CHAT_MAX_MESSAGE_RUNES", default=200_000, minimum=1)
HTTP_MAX_BODY_BYTES: int = _int("HTTP_MAX_BODY_BYTES", default=2_621_440, minimum=1024)
WS_MAX_FRAME_BYTES: int = _int("WS_MAX_FRAME_BYTES", default=2_621_440, minimum=1024)
settings_coherent(
    secret_key=SECRET_KEY,
    allowed_hosts=ALLOWED_HOSTS,
    debug=DEBUG,
    max_message_runes=CHAT_MAX_MESSAGE_RUNES,
    max_body_bytes=HTTP_MAX_BODY_BYTES,
    max_frame_bytes=WS_MAX_FRAME_BYTES,
)
DATA_UPLOAD_MAX_MEMORY_SIZE = HTTP_MAX_BODY_BYTES

# Threads serving sync views, middleware included, per process (cadau/asgihandler.py). Their
# own pool: a slow view (a password check) holds one of these, never a thread a streaming
# reply needs. With PostgreSQL, a process may hold a connection per thread: these, the worker
# pool (min(32, CPUs + 4): 6 on 2 CPUs), the background and model-wait pools (2 + 2) and
# Channels' one thread. 8 + 6 + 5 = 19 fits DB_POOL_MAX_SIZE's 20 on 2 CPUs. At most 256.
HTTP_THREADS: int = _int("HTTP_THREADS", default=8, minimum=1, maximum=256)

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first (max age, 401 for a bad key: cadau/tokens.py), then the session cookie.
        "cadau.tokens.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": API_THROTTLE_CLASSES,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["chat.api.parsers.JSONParser"],
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
# The schema and the Swagger UI are for logged-in users; true: anyone (cadau/apidocs.py).
API_DOCS_PUBLIC: bool = _bool("API_DOCS_PUBLIC", default=False)

# --- Cadau ----------------------------------------------------------------------------------
# Not "": Path("") is the working directory, and agents' memory went into the project tree.
RUNTIME_DIR = Path(env.str("RUNTIME_DIR", default="") or str(BASE_DIR / "runtime")).resolve()
# Agent memory files: "" = files under RUNTIME_DIR; or a STORAGES alias / dotted Storage path.
AGENT_MEMORY_STORAGE: str = env.str("AGENT_MEMORY_STORAGE", default="")
# Per agent: long-term entries and workspace files; past them a new one is refused (409).
AGENT_MEMORY_MAX_ENTRIES: int = _int("AGENT_MEMORY_MAX_ENTRIES", default=1000, minimum=1)
AGENT_WORKSPACE_MAX_FILES: int = _int("AGENT_WORKSPACE_MAX_FILES", default=1000, minimum=1)
# Extra agent tools (dotted paths to chat.tools.Tool objects) for agents whose "tools" name them.
AGENT_TOOLS: list[str] = env.list("AGENT_TOOLS", default=[])

LLM_BASE_URL: str = env.str("LLM_BASE_URL", default="").rstrip("/")
LLM_API_KEY: str = env.str("LLM_API_KEY", default="")
LLM_MODEL: str = env.str("LLM_MODEL", default="")
LLM_SUMMARY_MODEL: str = env.str("LLM_SUMMARY_MODEL", default="") or LLM_MODEL
LLM_TIMEOUT_SECONDS: float = _float("LLM_TIMEOUT_SECONDS", default=60.0, above=True)
# Every summarising call (compaction, checkpoints, titles, memory) waits this long instead: a
# summary is written whole before its first byte (minutes on a small CPU server).
LLM_SUMMARY_TIMEOUT_SECONDS: float = _float(
    "LLM_SUMMARY_TIMEOUT_SECONDS", default=180.0, above=True
)
LLM_CONNECT_TIMEOUT_SECONDS: float = _float("LLM_CONNECT_TIMEOUT_SECONDS", default=10.0, above=True)
LLM_MAX_RETRIES: int = _int("LLM_MAX_RETRIES", default=2)
# First retry waits this long, doubling (with jitter) up to 8 s; Retry-After wins when small.
LLM_RETRY_BACKOFF_SECONDS: float = _float("LLM_RETRY_BACKOFF_SECONDS", default=0.5)
# The models a non-staff user's agent or chat may name (default: the ones configured above).
LLM_ALLOWED_MODELS: list[str] = env.list(
    "LLM_ALLOWED_MODELS", default=[m for m in dict.fromkeys((LLM_MODEL, LLM_SUMMARY_MODEL)) if m]
)
# Requests the model server answers at once when few (1: llama.cpp without --parallel): then
# background compactions wait for no reply in flight (at most LLM_IDLE_WAIT_SECONDS). 0: no limit.
LLM_SERVER_SLOTS: int = _int("LLM_SERVER_SLOTS", default=0)
LLM_IDLE_WAIT_SECONDS: float = _float("LLM_IDLE_WAIT_SECONDS", default=120.0)
if LLM_BASE_URL and not LLM_BASE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured("LLM_BASE_URL must start with http:// or https://")

# Semantic recall (docs/search.md): an embedding model on an OpenAI-compatible /v1/embeddings.
# Empty model: off (lexical recall only, nothing embedded, no vector written).
LLM_EMBEDDING_MODEL: str = env.str("LLM_EMBEDDING_MODEL", default="")
LLM_EMBEDDING_BASE_URL: str = env.str("LLM_EMBEDDING_BASE_URL", default="").rstrip("/")
LLM_EMBEDDING_BASE_URL = LLM_EMBEDDING_BASE_URL or LLM_BASE_URL
LLM_EMBEDDING_API_KEY: str = env.str("LLM_EMBEDDING_API_KEY", default="") or LLM_API_KEY
# DIMENSIONS: asked of the server when > 0 (models that can shorten their vectors). BATCH: texts
# per request of the background embedder. The timeouts: its requests, and the send's one query
# embedding (past it, the send recalls lexically only).
LLM_EMBEDDING_DIMENSIONS: int = _int("LLM_EMBEDDING_DIMENSIONS", default=0)
LLM_EMBEDDING_BATCH: int = _int("LLM_EMBEDDING_BATCH", default=32, minimum=1)
LLM_EMBEDDING_TIMEOUT_SECONDS: float = _float(
    "LLM_EMBEDDING_TIMEOUT_SECONDS", default=30.0, above=True
)
LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS: float = _float(
    "LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS", default=2.0, above=True
)
if LLM_EMBEDDING_MODEL and not LLM_EMBEDDING_BASE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        "LLM_EMBEDDING_MODEL needs LLM_EMBEDDING_BASE_URL (or LLM_BASE_URL): an http(s):// URL"
    )

# The heading the session summary is sent to the model under (chat/context/heading.py): "auto"
# follows the summary's language (Chinese gets the original's 【历史对话摘要…】), "en" or "zh"
# forces one.
CHAT_SUMMARY_HEADING: str = env.str("CHAT_SUMMARY_HEADING", default="auto").strip().lower()
if CHAT_SUMMARY_HEADING not in ("auto", "en", "zh"):
    raise ImproperlyConfigured(
        f"CHAT_SUMMARY_HEADING: expected auto, en or zh, got {CHAT_SUMMARY_HEADING!r}"
    )

# Naming a session nobody named when a reply completes (chat/services/titles.py): "model" asks
# the summary model for a few words (one short call per session; the offline provider and a
# failed call take the first words of the message), "words" never calls, "off".
CHAT_AUTO_TITLE: str = env.str("CHAT_AUTO_TITLE", default="model").strip().lower()
if CHAT_AUTO_TITLE not in ("model", "words", "off"):
    raise ImproperlyConfigured(
        f"CHAT_AUTO_TITLE: expected model, words or off, got {CHAT_AUTO_TITLE!r}"
    )

# Recall (chat/context/compose.py, README "What the model is sent"): the budget's room left by
# the summary and the newest CHAT_CONTEXT_RECALL_TAIL_PCT of verbatim turns holds the turns that
# match the new message, at most CHAT_CONTEXT_RECALL_MAX_RUNES (0: the room).
# HISTORY_SEARCH_MAX_RUNES caps what one `history_search` call returns to the model.
CHAT_CONTEXT_RECALL: bool = _bool("CHAT_CONTEXT_RECALL", default=True)
CHAT_CONTEXT_RECALL_TAIL_PCT: int = _int("CHAT_CONTEXT_RECALL_TAIL_PCT", default=30, minimum=1)
if CHAT_CONTEXT_RECALL_TAIL_PCT > 100:
    raise ImproperlyConfigured("CHAT_CONTEXT_RECALL_TAIL_PCT: expected 1 to 100")
CHAT_CONTEXT_RECALL_MAX_RUNES: int = _int("CHAT_CONTEXT_RECALL_MAX_RUNES", default=0)
HISTORY_SEARCH_MAX_RUNES: int = _int("HISTORY_SEARCH_MAX_RUNES", default=4000, minimum=200)

# A send that arrives while the session's previous reply is still generating waits this long
# for it (a queue of one) before it is refused with `reply_in_progress`.
CHAT_SEND_QUEUE_SECONDS: float = _float("CHAT_SEND_QUEUE_SECONDS", default=30.0)
# A generating process renews its lease every third of this; a lapsed one's replies are failed,
# their sockets told, the sessions freed (chat/turn/lease.py). Longer than a loop stall.
CHAT_REPLY_LEASE_SECONDS: int = _int("CHAT_REPLY_LEASE_SECONDS", default=6, minimum=2)
# Replies one user may have generating at once, over all their sessions (0: no limit), and
# WebSockets one user may hold open in one server process (0: no limit).
CHAT_MAX_CONCURRENT_REPLIES: int = _int("CHAT_MAX_CONCURRENT_REPLIES", default=4)
CHAT_MAX_SOCKETS_PER_USER: int = _int("CHAT_MAX_SOCKETS_PER_USER", default=20)
# Frames one WebSocket may send per minute; past it the socket is closed (4429).
WS_MAX_FRAMES_PER_MINUTE: int = _int("WS_MAX_FRAMES_PER_MINUTE", default=120)
# After a reply, compact in a background thread when the next turn would cross the threshold.
CHAT_BACKGROUND_COMPACTION: bool = _strict(env.bool, "CHAT_BACKGROUND_COMPACTION", default=True)

# Rolling-context knobs: environment, then the `chat_context` section of the file CADAU_CONFIG
# names, or, when it is unset, of mindlink.json in the working directory if there is one (the
# seed's file, found where the original found it); the file overrides the environment as the
# seed specifies. CADAU_CONFIG="" reads no file. The path read, or "".
CADAU_CONFIG: str = config_path_find(environ=env.ENVIRON, cwd=Path.cwd()) or ""
CHAT_CONTEXT = load_chat_context(environ=env.ENVIRON, config_path=CADAU_CONFIG or None)

LOG_LEVEL: str = (env.str("LOG_LEVEL", default="") or "INFO").strip().upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(
        f"LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {LOG_LEVEL[:40]!r}"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "filters": {
        "refusal_as_warning": {"()": "cadau.logfilters.RefusalAsWarning"},
        "client_error_without_traceback": {"()": "cadau.logfilters.ClientErrorWithoutTraceback"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "django.security.DisallowedHost": {"filters": ["refusal_as_warning"]},
        "django.request": {"filters": ["client_error_without_traceback"]},
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# Serve straight from the app's static folders (no collectstatic step, same in every deployment).
WHITENOISE_USE_FINDERS = True
# Brotli and gzip copies of the static files, named by content hash (cadau/compression.py).
STATIC_COMPRESSED_DIR = RUNTIME_DIR / "static-compressed"
