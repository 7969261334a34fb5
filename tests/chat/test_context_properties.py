"""Properties of the two pure decisions of the context engine, over random conversations:
where to cut (never inside a turn, always keeping min_verbatim) and how a payload is trimmed
when a summary fails (always under the hard limit, never a partial turn)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadau.contextconfig import ContextConfig
from chat.services import context as ctx

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
@given(tail=tails(), limit=st.integers(min_value=500, max_value=40000))
def test_trimmed_payload_fits_and_starts_at_a_turn(tail, limit):
    state = ctx.ContextState(
        session=None,
        cfg=ContextConfig(),
        system_prompt="p" * 100,
        tail=tail,
        backlog=False,
        rows_read=len(tail),
    )
    # ContextState.summary reads session.context_summary; a stand-in with an empty summary.
    state.session = type("S", (), {"context_summary": ""})()
    total = 100 + sum(m.runes for m in tail)
    try:
        kept, dropped = ctx._trim_to_fit(state=state, limit=limit)
    except ctx.PayloadTooLarge:
        starts = [i for i, m in enumerate(tail) if m.role == "user"] or [0]
        assert 100 + sum(m.runes for m in tail[starts[-1] :]) > limit
        return
    assert 100 + sum(m.runes for m in kept) <= limit
    assert kept == tail[dropped:]
    if dropped:
        assert total > limit
        assert kept[0].role == "user"
