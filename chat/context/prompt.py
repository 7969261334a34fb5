"""What a session's model calls are configured with: its context knobs and its system prompt."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings

from cadau.contextconfig import ContextConfig, context_capped
from chat.context.heading import summary_block
from chat.hooks import PromptPart, system_prompt_hooks
from chat.llm import get_provider
from chat.models import Agent, ChatSession

logger = logging.getLogger("chat.context")

DEFAULT_SYSTEM_PROMPT = "You are Cadau, a helpful assistant. Answer clearly and accurately."


def context_config_for(*, session: ChatSession) -> ContextConfig:
    """Global knobs, then the agent's `config_json["context"]` overrides, which for a user who
    is not staff stop at the global values of the knobs that cost model use (they are refused
    on save; this holds for agents saved before the cap, or edited by hand)."""
    server: ContextConfig = settings.CHAT_CONTEXT
    agent = session.agent
    overrides = (agent.config_json or {}).get("context") if agent is not None else None
    if not overrides:
        return server
    try:
        cfg = server.with_overrides(overrides, source=f"agent {agent.pk} config_json.context")  # type: ignore[union-attr]
    except Exception as exc:  # validated on save; a hand-edited row must not break sends
        logger.warning("chat_context_config_invalid session=%s error=%s", session.pk, exc)
        return server
    return cfg if session.owner.is_staff else context_capped(cfg, cap=server)


def model_allowed(*, model: str) -> bool:
    """An agent's model may be "" (the server's) or one the operator lists."""
    return not model or model in settings.LLM_ALLOWED_MODELS


def agent_model(*, agent: Agent | None) -> str | None:
    """The model the agent's replies use: its own when the operator allows it (an agent saved
    before the allow-list, or edited by hand, falls back to the server's), else None."""
    if agent is None or not agent.model or not model_allowed(model=agent.model):
        return None
    return agent.model


def reply_model(*, session: ChatSession) -> str | None:
    """The model a session's replies are sent to: the one chosen for the chat while the
    operator still allows it, else its agent's, else None (the server's own)."""
    if session.model and model_allowed(model=session.model):
        return session.model
    return agent_model(agent=session.agent)


def session_model(*, session: ChatSession) -> str:
    """The model a session's replies go to (for what is learned about its window)."""
    return reply_model(session=session) or get_provider().model


def system_text(*, system_prompt: str, summary: str) -> str:
    """The payload's system message: the system prompt, then the summary block."""
    if not summary:
        return system_prompt
    return f"{system_prompt}\n\n{summary_block(summary=summary)}"


def base_prompt(*, session: ChatSession) -> str:
    """The agent's prompt, or the default: the system prompt before any hook adds to it."""
    agent = session.agent
    return (agent.system_prompt.strip() if agent is not None else "") or DEFAULT_SYSTEM_PROMPT


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    """A session's system prompt as loaded once: the base prompt and the parts the system-prompt
    hooks loaded (long-term memory). `text(query)` renders it for one user message without any
    I/O, so one load serves the payload (ranked for the message) and the budget (no message)."""

    base: str
    parts: tuple[PromptPart, ...] = ()

    def text(self, query: str = "") -> str:
        extras = [part(query) for part in self.parts]
        return "\n\n".join([self.base, *[e for e in extras if e]])


def system_prompt_load(*, session: ChatSession) -> SystemPrompt:
    parts = (hook(session=session) for hook in system_prompt_hooks)
    return SystemPrompt(base=base_prompt(session=session), parts=tuple(p for p in parts if p))
