"""What the next model call of a session would see, read in a bounded number of rows: the
system prompt, the summary, and the verbatim tail (every message from the anchor on). Also the
`context_budget` figure the API and the ring show, which is this state's size."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from cadau.contextconfig import ContextConfig
from chat.context.prompt import (
    SystemPrompt,
    context_config_for,
    session_model,
    system_prompt_load,
    system_text,
)
from chat.llm import get_provider
from chat.llm.base import Message
from chat.llm.window import (
    reply_reserve_tokens,
    tokens_estimate,
    window_learned_get,
    window_probe_start,
)
from chat.models import EXCLUDED_FROM_MODEL, ChatMessage, ChatSession, MessageRole
from chat.queries import message_tail_rows

# Rows fetched per round trip while reading the verbatim tail newest-first. A compacted
# session's read is bounded by its anchor (its tail since the anchor is all there is): one
# large page, as a tail of a few hundred messages is usual between compactions and every
# statement is on the way to the first token. A session never compacted (an import) is read
# until the hard limit, checked after each page: a smaller page then, as whatever a page reads
# past the limit is read for nothing.
TAIL_PAGE = 500
TAIL_PAGE_UNANCHORED = 200


def _tail_page_size(session: ChatSession) -> int:
    return TAIL_PAGE if session.verbatim_since_message_id is not None else TAIL_PAGE_UNANCHORED


# Rows a later page of a tail read is sized at above the estimate, and its least size.
PAGE_MARGIN = 1.25
PAGE_MIN = 20


def _next_page(page_size: int, rows_read: int, runes: int, budget_left: int) -> int:
    """The first page is `page_size`; a later one only as many rows as the runes still needed
    take at the average size of the rows read so far, with a margin: a session never compacted
    whose newest 200 messages were short read another 200 for the dozens it needed."""
    if not rows_read or runes <= 0:
        return page_size
    needed = (budget_left - runes) * rows_read / runes
    return max(PAGE_MIN, min(page_size, int(needed * PAGE_MARGIN) + 1))


def message_runes(*, content: str, tool_calls: Any = None) -> int:
    runes = len(content)
    if tool_calls:
        runes += len(json.dumps(tool_calls, ensure_ascii=False))
    return runes


@dataclass(frozen=True, slots=True)
class TailMessage:
    id: int
    role: str
    content: str
    tool_calls: Any
    tool_call_id: str
    runes: int
    # When it was written, as the database gave it (text on SQLite, chat/queries.py), for
    # recall's dated pieces: a tail message the payload leaves out is recalled from here, not
    # read again. None where it was not read. Not compared: the same row read raw and through
    # the ORM is the same message.
    stamp: Any = field(default=None, compare=False)

    @classmethod
    def from_row(cls, row: ChatMessage) -> TailMessage:
        return cls(
            id=row.pk,
            role=row.role,
            content=row.content,
            tool_calls=row.tool_calls,
            tool_call_id=row.tool_call_id,
            runes=message_runes(content=row.content, tool_calls=row.tool_calls),
            stamp=row.created_at,
        )

    def as_openai(self) -> Message:
        msg: Message = {"role": self.role, "content": self.content}
        if self.role == MessageRole.ASSISTANT and self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.role == MessageRole.TOOL:
            msg["tool_call_id"] = self.tool_call_id
        return msg


def for_model(rows: Iterable[ChatMessage]) -> Iterator[TailMessage]:
    """The rows the model is sent, as TailMessages (see EXCLUDED_FROM_MODEL)."""
    return (TailMessage.from_row(r) for r in rows if r.status not in EXCLUDED_FROM_MODEL)


def tail_page(
    *,
    session_id: int,
    order: Literal["id", "-id"],
    limit: int,
    from_id: int | None = None,
    below_id: int | None = None,
    peek: bool = False,
) -> tuple[list[TailMessage], int, int, bool]:
    """One page of the session's messages with `from_id <= id < below_id` in `order`, as the
    model is sent them, the last id read (0 for none), the number of rows read and whether
    more rows lie past the page. That last is only known with `peek` (one row more is fetched
    and left out; else it is False), which answers "is there more?" in the page's own
    statement instead of a second one.
    Tuples, not model instances: building a ChatMessage per row was most of a send's tail
    read, and every send of a long chat reads a page of it before the first token."""
    rows = message_tail_rows(
        session_id=session_id,
        order=order,
        limit=limit + 1 if peek else limit,
        from_id=from_id,
        below_id=below_id,
    )
    more = len(rows) > limit
    if more:
        del rows[limit:]
    page = [
        TailMessage(
            id=mid,
            role=role,
            content=content,
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
            runes=message_runes(content=content, tool_calls=tool_calls),
            stamp=stamp,
        )
        for mid, role, content, tool_calls, tool_call_id, status, stamp in rows
        if status not in EXCLUDED_FROM_MODEL
    ]
    return page, (rows[-1][0] if rows else 0), len(rows), more


@dataclass(slots=True)
class ContextState:
    session: ChatSession
    cfg: ContextConfig
    # `prompt` rendered for the message this state was read for.
    system_prompt: str
    tail: list[TailMessage]
    # True when the tail read stopped (row or rune bound) before reaching the anchor: there are
    # unsummarised messages older than `tail` that the payload cannot hold.
    backlog: bool
    rows_read: int
    # The system prompt as loaded, to render again for another message without reloading it.
    prompt: SystemPrompt = field(default_factory=lambda: SystemPrompt(base=""))
    # Which limit `cfg.input_budget_runes` is, once the model's window is known: "window" (it
    # binds) or "budget"; "" while the window is unknown.
    binding: str = ""
    # When the window binds: the tokens a payload may take (the window less the reply's room)
    # and the model whose tokenizer counts them. The rune budget above is converted at this
    # conversation's average runes per token; a payload is measured in tokens, message by
    # message, because a turn in a cheaper script (English beside Chinese) fits where the
    # average says it does not.
    input_tokens: int = 0
    model: str = ""
    # The summary as this one call sends it, when it had to yield room (chat/context/payload.py);
    # None: as stored.
    summary_for_call: str | None = None

    @property
    def summary(self) -> str:
        if self.summary_for_call is not None:
            return self.summary_for_call
        return self.session.context_summary

    @property
    def system_runes(self) -> int:
        return len(system_text(system_prompt=self.system_prompt, summary=self.summary))

    @property
    def tail_runes(self) -> int:
        return sum(m.runes for m in self.tail)

    @property
    def runes(self) -> int:
        return self.system_runes + self.tail_runes


def context_state_read(
    *, session: ChatSession, query: str = "", prompt: SystemPrompt | None = None
) -> ContextState:
    """Read the verbatim tail newest-first, stopping at the anchor, at `history_read_limit` rows,
    or once it holds more than the hard limit: a payload can never use more than that, so rows
    beyond it are only ever needed by a compaction (which reads them itself, in chunks).
    `prompt`: the session's system prompt when the caller loaded it already."""
    cfg = context_config_for(session=session)
    prompt = prompt if prompt is not None else system_prompt_load(session=session)
    rendered = prompt.text(query)
    hard = cfg.effective_hard_limit_runes
    budget_left = hard - len(system_text(system_prompt=rendered, summary=session.context_summary))
    newest_first: list[TailMessage] = []
    rows_read = 0
    runes = 0
    backlog = False
    upper: int | None = None
    page_size = _tail_page_size(session)
    while True:
        take = min(
            _next_page(page_size, rows_read, runes, budget_left), cfg.history_read_limit - rows_read
        )
        page, last_id, read, more = tail_page(
            session_id=session.pk,
            order="-id",
            limit=take,
            from_id=session.verbatim_since_message_id,
            below_id=upper,
            peek=True,
        )
        rows_read += read
        for msg in page:
            newest_first.append(msg)
            runes += msg.runes
        if not more:
            break  # reached the anchor
        upper = last_id
        if runes > budget_left or rows_read >= cfg.history_read_limit:
            backlog = True
            break
    newest_first.reverse()
    state = ContextState(
        session=session,
        cfg=cfg,
        prompt=prompt,
        system_prompt=rendered,
        tail=newest_first,
        backlog=backlog,
        rows_read=rows_read,
    )
    _window_apply(state)
    return state


def _window_apply(state: ContextState) -> None:
    """Bring the rune budget down to the model's window when that is the smaller: the window
    in tokens (configured, or learned from the server) less room for the reply, converted at
    the runes per token this conversation's own text is estimated at. Everything downstream
    (compaction, trimming, the budget shown) then works within it."""
    cfg = state.cfg
    model = session_model(session=state.session)
    window = cfg.window_tokens or window_learned_get(model=model)
    if not window:
        return
    system = system_text(system_prompt=state.system_prompt, summary=state.summary)
    text = system + "".join(m.content for m in state.tail)
    runes_per_token = len(text) / tokens_estimate(text, model=model)
    input_tokens = window - reply_reserve_tokens(window)
    limit = int(input_tokens * runes_per_token)
    if limit >= cfg.effective_hard_limit_runes:
        state.binding = "budget"
        return
    state.binding = "window"
    state.input_tokens = input_tokens
    state.model = model
    state.cfg = dataclasses.replace(
        cfg,
        window_tokens=window,
        input_budget_runes=max(limit, 1),
        hard_limit_runes=0,
        # A summary must leave room for the turns it stands beside.
        summary_max_runes=max(200, min(cfg.summary_max_runes, limit // 4)),
    )


def context_window_probe_start(*, session: ChatSession) -> None:
    """Have the model server asked what window it gives the session's model (its /v1/models),
    once per model and process, in a background thread; not when the window is configured.
    Network I/O, so no read does it: the send calls it before reading the context. Until the
    answer arrives, and if the server states none, the state is as if it had not been asked."""
    if context_config_for(session=session).window_tokens:
        return
    provider = get_provider()
    listing = getattr(provider, "models_listing", None)
    if listing is not None and not provider.is_offline:
        window_probe_start(model=session_model(session=session), fetch=listing)


def context_state_fresh(
    *, session_id: int, query: str = "", prompt: SystemPrompt | None = None
) -> ContextState:
    """`context_state_read` of the session as stored now: a compaction may have moved the
    summary since the caller last looked."""
    session = ChatSession.objects.select_related("agent", "owner").get(pk=session_id)
    return context_state_read(session=session, query=query, prompt=prompt)


def context_moved(*, session: ChatSession) -> bool:
    """Whether the session's summary or anchor moved (a compaction committed, a truncation) since
    `session` was read: its context_version is no longer the one stored."""
    return not ChatSession.objects.filter(
        pk=session.pk, context_version=session.context_version
    ).exists()


def context_state_after_reply(
    *, state: ContextState, message: ChatMessage, unchanged: bool
) -> ContextState:
    """The context once `message` (a reply, the session's newest row) is stored, as a fresh read
    would return it. `state` is what the reply's payload was built from; `unchanged` says that
    nothing moved the context since (the final write's guard on the context version and the
    agent). Then the answer is worked out from `state` with no query at all (the `done` budget
    of 200 replies ending at once was two queries each, GIL time the other replies' last
    tokens waited for), but only where a fresh read certainly returns the same rows plus this
    one: `state`'s read reached the anchor within its first page, and `message` is that read's
    newest row or newer. Anywhere else: a fresh read."""
    tail = [m for m in state.tail if m.id != message.pk]
    if (
        unchanged
        and not state.backlog
        and state.rows_read < min(_tail_page_size(state.session), state.cfg.history_read_limit)
        and not (tail and tail[-1].id > message.pk)
    ):
        return ContextState(
            session=state.session,
            cfg=state.cfg,
            prompt=state.prompt,
            # As a fresh read renders it: for no particular message.
            system_prompt=state.prompt.text(),
            tail=[*tail, *for_model([message])],
            backlog=False,
            rows_read=0,
            binding=state.binding,
            input_tokens=state.input_tokens,
            model=state.model,
        )
    return context_state_fresh(session_id=state.session.pk)


def context_budget_from_state(*, state: ContextState) -> dict[str, Any]:
    """The budget a context state already read stands for: no query."""
    limit = state.cfg.input_budget_runes
    used = state.runes
    budget: dict[str, Any] = {
        "used_runes": used,
        "limit_runes": limit,
        "used_pct": round(100.0 * used / limit, 1) if limit else 0.0,
    }
    if state.binding:
        # Once the model's window is known: which limit this is (docs/api.md, context_budget).
        budget["binding"] = state.binding
    return budget


def context_budget_from_db(*, session_id: int) -> dict[str, Any]:
    """The budget of session `session_id` as stored now: its row and context read afresh from
    the database (a compaction may have moved the summary since the caller's copy)."""
    return context_budget_from_state(state=context_state_fresh(session_id=session_id))


def context_needs_compaction(*, state: ContextState, reserve_runes: int = 0) -> bool:
    """Over the threshold now, or (with `reserve_runes`, the expected size of the next turn)
    about to be: background compaction asks the second question."""
    cfg = state.cfg
    return state.backlog or state.runes + reserve_runes > min(
        cfg.threshold_runes, cfg.effective_hard_limit_runes
    )
