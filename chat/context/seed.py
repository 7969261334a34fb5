"""The seed's compaction loop as the original design writes it, kept to compare
against (`CHAT_CONTEXT_STRATEGY=seed`; bench/context.py runs both): read up to
`history_read_limit` rows on every send, then, while the estimate is over the threshold or the
hard limit, summarise the oldest `roll_batch` verbatim messages with one call per batch, at most
`max_rounds` times. It shares the commit step (chat/context/commit.py) with ours."""

from __future__ import annotations

from chat.context.commit import CompactionResult, compact_chunk
from chat.context.prompt import context_config_for, system_text
from chat.context.state import ContextState, for_model
from chat.models import ChatMessage, ChatSession
from chat.queries import message_rows


class SeedStrategy:
    name = "seed"
    # The seed runs its loop on every send (it re-reads its history window each time), and
    # has no compaction after a reply.
    runs_every_send = True
    in_background = False

    def compact(
        self,
        *,
        session: ChatSession,
        state: ContextState,
        result: CompactionResult,
        force: bool,
        instructions: str,
        query: str,
    ) -> None:
        cfg = context_config_for(session=session)
        prompt = state.system_prompt
        rows = list(
            message_rows(
                ChatMessage.objects.filter(session_id=session.pk),
                order="-id",
                limit=cfg.history_read_limit,
            )
        )
        rows.reverse()
        result.rows_read = len(rows)
        anchor = session.verbatim_since_message_id
        prior = list(for_model([r for r in rows if anchor is None or r.pk >= anchor]))
        rounds = 0

        def estimate() -> int:
            return len(system_text(system_prompt=prompt, summary=session.context_summary)) + sum(
                m.runes for m in prior
            )

        while rounds < cfg.max_rounds:
            runes = estimate()
            if runes <= cfg.threshold_runes and runes <= cfg.effective_hard_limit_runes:
                break
            if len(prior) <= cfg.min_verbatim:
                break
            size = min(cfg.roll_batch, len(prior) - cfg.min_verbatim)
            batch, prior = prior[:size], prior[size:]
            rounds += 1
            after = compact_chunk(
                session=session,
                cfg=cfg,
                chunk=batch,
                anchor_after=prior[0].id,
                result=result,
                instructions="",
                runes_before=runes,
            )
            if after is None:
                break
        result.runes_after = estimate()
