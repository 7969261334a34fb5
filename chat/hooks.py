"""Extension points where work agents (agentmemory) plug into chat without chat importing them.
Registered once at start-up (an AppConfig.ready()). All hooks are sync and run in worker threads.

- pre_compaction_hooks(session=, messages=): before messages leave the verbatim context.
  Raising aborts that compaction (nothing moves), so no batch is summarised without its flush
  record.
- system_prompt_hooks(session=) -> PromptPart | None: text appended to the system prompt (long-
  term memory). The hook does its I/O once and returns a function of the user's message that
  renders the text from what it loaded (most relevant first for that message; "" for none),
  within its own rune cap. A send calls each hook once and renders from that for the payload
  and again for the budget, so memory files are read once per send. Rendered with "" (no
  particular message) for the budget between sends and for the send's fit check: what a part
  adds only for a message (automatic recall) is an extra, dropped from a payload the message
  would not fit beside (context_payload_build), so it never refuses a message.
- turn_started_hooks(session=, user_message=) -> list[event]: right after the user message is
  stored; returned events (e.g. {"type": "memory", ...}) go to the session's sockets.
- turn_finished_hooks(session=, user_message=, assistant_message=): after a reply completes.
  Failures are logged and never affect the stored reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PromptPart = Callable[[str], str]
PreCompactionHook = Callable[..., None]
SystemPromptHook = Callable[..., PromptPart | None]
TurnStartedHook = Callable[..., list[dict[str, Any]]]
TurnFinishedHook = Callable[..., None]

pre_compaction_hooks: list[PreCompactionHook] = []
system_prompt_hooks: list[SystemPromptHook] = []
turn_started_hooks: list[TurnStartedHook] = []
turn_finished_hooks: list[TurnFinishedHook] = []
