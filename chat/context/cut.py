"""Where a compaction cuts the verbatim tail, chosen without calling the model."""

from __future__ import annotations

from collections.abc import Sequence

from cadau.contextconfig import ContextConfig
from chat.context.heading import SUMMARY_PREFIX_MAX_RUNES, summary_quoted_runes
from chat.context.state import TailMessage
from chat.models import MessageRole


def turn_starts(tail: Sequence[TailMessage]) -> list[int]:
    """Indexes where a turn starts: a user message. Cutting only there keeps every turn, and every
    assistant tool call with its tool results, on one side of the cut."""
    return [i for i, m in enumerate(tail) if m.role == MessageRole.USER]


def assumed_summary_runes(*, cfg: ContextConfig, summary: str, compacted_runes: int) -> int:
    # A merged summary is usually a fraction of what it absorbs; over-estimating only makes the
    # cut a little deeper, under-estimating would trigger compaction again on the next send.
    return min(cfg.summary_cap_runes, len(summary) + compacted_runes // 3 + 400)


def context_choose_cut(
    *,
    tail: Sequence[TailMessage],
    system_runes_without_summary: int,
    summary: str,
    cfg: ContextConfig,
    backlog: bool = False,
    force: bool = False,
) -> int | None:
    """Index into `tail`: messages before it go into the summary. None: no valid cut.

    Picks the shallowest turn boundary that brings the estimated payload down to the target
    watermark, keeping at least `min_verbatim` messages; if none reaches the target, the deepest
    valid boundary (the most it can do without splitting a turn)."""
    n = len(tail)
    candidates = [i for i in turn_starts(tail) if n - i >= cfg.min_verbatim]
    if not backlog:
        candidates = [i for i in candidates if i > 0]
    if not candidates:
        return None
    target = cfg.target_runes
    prefix = [0]
    for m in tail:
        prefix.append(prefix[-1] + m.runes)
    for i in candidates:
        compacted = prefix[i]
        after = (
            system_runes_without_summary
            + SUMMARY_PREFIX_MAX_RUNES
            + summary_quoted_runes(
                assumed_summary_runes(cfg=cfg, summary=summary, compacted_runes=compacted)
            )
            + (prefix[n] - prefix[i])
        )
        if after <= target and not force:
            return i
    # Nothing reaches the target (or "compact now" asked for the most): compact as much as the
    # boundaries and min_verbatim allow.
    return candidates[-1]
