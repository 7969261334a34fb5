"""The rolling model context (docs/architecture.md), one module per job:

- prompt: a session's context knobs and system prompt;
- state: the verbatim tail as read for the next call, and its `context_budget`;
- budget: the budget estimate for session lists (one query per page);
- cut: where a compaction cuts, without calling the model;
- summarise: the one summarising call (shared with the tool loop's checkpoints and memory
  extraction) and its transcript format;
- commit: one compaction step (flush, summarise, compare-and-swap commit) and the lease;
- compaction: `context_compact`, the entry point for every trigger, and our strategy;
- seed: the original design's loop, selectable for comparison;
- payload: the messages of a model call;
- trim: fitting a payload under the hard limit or the model's window, for that call only.

Layers: the database keeps every message; the model gets `context_summary` (everything before
the verbatim anchor, compressed) + the verbatim tail (id >= anchor) + the new message, under a
rune budget. Compaction moves the anchor forward and merges what it passes into the summary.

Callers import what they use from here; the names below are the engine's public surface.
"""

from chat.context.budget import context_budget_from_row, with_context_runes
from chat.context.commit import CompactionResult, Trigger
from chat.context.compaction import (
    SendCompaction,
    context_compact,
    context_compaction_decide,
    context_reset,
    context_strategy,
)
from chat.context.compose import Recaller
from chat.context.cut import context_choose_cut
from chat.context.heading import (
    SUMMARY_PREFIX_EN,
    SUMMARY_PREFIX_ZH,
    summary_block,
    summary_prefix,
)
from chat.context.payload import (
    Payload,
    context_check_fits,
    context_payload_build,
)
from chat.context.prompt import (
    DEFAULT_SYSTEM_PROMPT,
    SystemPrompt,
    context_config_for,
    system_prompt_load,
    system_text,
)
from chat.context.state import (
    TAIL_PAGE,
    ContextState,
    TailMessage,
    context_budget_from_db,
    context_budget_from_state,
    context_moved,
    context_needs_compaction,
    context_state_after_reply,
    context_state_fresh,
    context_state_read,
    context_window_probe_start,
    for_model,
    message_runes,
)
from chat.context.summarise import SummaryRejected, summary_validate
from chat.context.trim import PayloadTooLarge, Trimmed, trim_to_fit, trim_to_window

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "SUMMARY_PREFIX_EN",
    "SUMMARY_PREFIX_ZH",
    "TAIL_PAGE",
    "CompactionResult",
    "ContextState",
    "Payload",
    "PayloadTooLarge",
    "Recaller",
    "SendCompaction",
    "SummaryRejected",
    "SystemPrompt",
    "TailMessage",
    "Trigger",
    "Trimmed",
    "context_budget_from_db",
    "context_budget_from_row",
    "context_budget_from_state",
    "context_check_fits",
    "context_choose_cut",
    "context_compact",
    "context_compaction_decide",
    "context_config_for",
    "context_moved",
    "context_needs_compaction",
    "context_payload_build",
    "context_reset",
    "context_state_after_reply",
    "context_state_fresh",
    "context_state_read",
    "context_strategy",
    "context_window_probe_start",
    "for_model",
    "message_runes",
    "summary_block",
    "summary_prefix",
    "summary_validate",
    "system_prompt_load",
    "system_text",
    "trim_to_fit",
    "trim_to_window",
    "with_context_runes",
]
