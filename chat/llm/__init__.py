"""Which model the process talks to.

`get_provider()` is the only way code should obtain a provider: it is built from settings once
and shared (so the HTTP connection pool is shared), and rebuilt automatically when the LLM
settings change (tests override them per test). `reset_provider()` drops it explicitly.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from chat.llm.base import (
    SUMMARY_MARKER,
    Completion,
    ContextLengthExceeded,
    EmptyReply,
    EmptyStream,
    LLMError,
    LLMProvider,
    Message,
    StreamEvent,
    StreamInterrupted,
    ToolCall,
    Usage,
    is_summary_request,
)
from chat.llm.offline import OfflineProvider
from chat.llm.openai_compat import OpenAICompatProvider

__all__ = [
    "SUMMARY_MARKER",
    "Completion",
    "ContextLengthExceeded",
    "EmptyReply",
    "EmptyStream",
    "LLMError",
    "LLMProvider",
    "Message",
    "OfflineProvider",
    "OpenAICompatProvider",
    "StreamEvent",
    "StreamInterrupted",
    "ToolCall",
    "Usage",
    "get_provider",
    "is_summary_request",
    "provider_info",
    "reset_provider",
]

_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], LLMProvider] | None = None


def _config() -> tuple[Any, ...]:
    return (
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        settings.LLM_MODEL,
        settings.LLM_SUMMARY_MODEL,
        settings.LLM_TIMEOUT_SECONDS,
        settings.LLM_SUMMARY_TIMEOUT_SECONDS,
        settings.LLM_CONNECT_TIMEOUT_SECONDS,
        settings.LLM_MAX_RETRIES,
        # Not in settings.py; tests set it to keep retry tests fast.
        getattr(settings, "LLM_RETRY_BACKOFF_SECONDS", 0.5),
    )


def _build(config: tuple[Any, ...]) -> LLMProvider:
    base_url, api_key, model, summary_model, timeout, summary_timeout, connect_timeout = config[:7]
    retries, backoff = config[7:]
    if not base_url:
        return OfflineProvider()
    return OpenAICompatProvider(
        base_url=base_url,
        api_key=api_key,
        model=model,
        summary_model=summary_model or model,
        timeout_seconds=float(timeout),
        summary_timeout_seconds=float(summary_timeout),
        connect_timeout_seconds=float(connect_timeout),
        max_retries=int(retries),
        backoff_base_seconds=float(backoff),
    )


def get_provider() -> LLMProvider:
    """The process-wide provider: OfflineProvider when LLM_BASE_URL is empty."""
    global _cached
    config = _config()
    with _lock:
        if _cached is None or _cached[0] != config:
            _cached = (config, _build(config))
        return _cached[1]


def reset_provider() -> None:
    """Forget the cached provider; the next get_provider() builds a fresh one."""
    global _cached
    with _lock:
        _cached = None


def _host_only(url: str) -> str:
    # Only host[:port]: a base URL may embed credentials (user:pass@) or tokens in its path.
    parts = urlsplit(url)
    if not parts.hostname:
        return ""
    return parts.hostname + (f":{parts.port}" if parts.port else "")


def provider_info() -> dict[str, Any]:
    """What the UI/API shows about the active provider. Never includes the key."""
    provider = get_provider()
    return {
        "name": provider.name,
        "model": provider.model,
        "summary_model": provider.summary_model,
        "offline": provider.is_offline,
        "base_url": "" if provider.is_offline else _host_only(settings.LLM_BASE_URL),
    }
