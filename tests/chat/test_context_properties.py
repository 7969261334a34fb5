"""Properties of the two pure decisions of the context engine, over random conversations:
where to cut (never inside a turn, always keeping min_verbatim) and how a payload is trimmed
when a summary fails (always under the hard limit, never a partial turn)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadau.contextconfig import ContextConfig
from chat import context as ctx

ROLES = ["user", "assistant", "tool"]


@st.composite
def tails(draw: st.DrawFn) -> list[ctx.TailMessage]:
    n = draw(st.integers(min_value=1, max_value=60))
    out = []
    for i in range(n):
        role = draw(st.sampled_from(ROLES)) if i else draw(st.sampled_from(["user", "assistant"]))
        runes = draw(st.integers(min_value=0, max_value=3000))
        out.append(
            ctx.TailMessage(
                id=i + 1,
                role=role,
                content="x" * runes,
                tool_calls=None,
                tool_call_id="",
                runes=runes,
            )
        )
    return out


configs = st.builds(
    ContextConfig,
    input_budget_runes=st.integers(min_value=2000, max_value=60000),
    threshold_pct=st.integers(min_value=60, max_value=95),
    target_pct=st.integers(min_value=20, max_value=55),
    min_verbatim=st.integers(min_value=1, max_value=8),
    summary_max_runes=st.integers(min_value=200, max_value=4000),
)


@settings(max_examples=400, deadline=None)
@given(tail=tails(), cfg=configs, backlog=st.booleans(), force=st.booleans())
def test_cut_is_a_turn_boundary_that_keeps_min_verbatim(tail, cfg, backlog, force):
    cut = ctx.context_choose_cut(
        tail=tail,
        system_runes_without_summary=100,
        summary="s" * 50,
        cfg=cfg,
        backlog=backlog,
        force=force,
    )
    if cut is None:
        valid = [
            i
            for i, m in enumerate(tail)
            if m.role == "user" and len(tail) - i >= cfg.min_verbatim and (backlog or i > 0)
        ]
        assert not valid
        return
    assert tail[cut].role == "user"
    assert len(tail) - cut >= cfg.min_verbatim
    assert backlog or cut > 0


@settings(max_examples=400, deadline=None)
@given(
    tail=tails(),
    limit=st.integers(min_value=500, max_value=40000),
    min_verbatim=st.integers(min_value=1, max_value=8),
)
def test_trimmed_payload_fits_starts_at_a_turn_and_keeps_the_question(tail, limit, min_verbatim):
    state = ctx.ContextState(
        session=None,
        cfg=ContextConfig(min_verbatim=min_verbatim),
        system_prompt="p" * 100,
        tail=tail,
        backlog=False,
        rows_read=len(tail),
    )
    # ContextState.summary reads session.context_summary; a stand-in with an empty summary.
    state.session = type("S", (), {"context_summary": ""})()
    total = 100 + sum(m.runes for m in tail)
    users = [i for i, m in enumerate(tail) if m.role == "user"]
    asked = tail[users[-1]] if users else None
    try:
        trimmed = ctx.trim_to_fit(state=state, limit=limit)
    except ctx.PayloadTooLarge:
        # Only when the message being answered cannot fit beside the system prompt.
        assert asked is None or 100 + asked.runes > limit or _unshortenable(tail, limit)
        return
    kept, dropped = trimmed.tail, trimmed.dropped
    assert 100 + sum(m.runes for m in kept) <= limit
    # The same messages as the tail from `dropped` on, in order; each whole or its head and
    # end around a marker; the message being answered always whole.
    assert [m.id for m in kept] == [m.id for m in tail[dropped:]]
    shortened = 0
    for m, original in zip(kept, tail[dropped:], strict=True):
        if m.content != original.content:
            shortened += 1
            head, _, end = m.content.partition("\n…[")
            assert original.content.startswith(head)
            assert original.content.endswith(end.split("]…\n", 1)[1])
            assert m is not asked
    assert shortened == trimmed.shortened
    if dropped or shortened:
        assert total > limit
    if dropped:
        assert kept[0].role == "user"


def _unshortenable(tail: list[ctx.TailMessage], limit: int) -> bool:
    """No start leaves a tail whose messages, shortened as far as they go, fit."""
    floor = ctx.trim.MIN_KEPT_RUNES + len(ctx.trim.SHORTENED_MARKER.format(n=3000))
    users = [i for i, m in enumerate(tail) if m.role == "user"]
    last = users[-1]
    least = 100 + sum(
        m.runes if i == last else min(m.runes, floor) for i, m in enumerate(tail) if i >= last
    )
    return least > limit
