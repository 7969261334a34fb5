"""The rolling summary: cut selection, compaction against the real fake LLM server over HTTP,
every fault it can inject, seed mode, and the payload bound."""

from __future__ import annotations

import pytest

from cadau.contextconfig import ContextConfig
from chat import context as ctx
from chat import hooks
from chat.context.commit import lease_claim, lease_release
from chat.models import ChatMessage, ChatSession, ContextSnapshot, MessageRole, SnapshotOutcome
from chat.services.sessions import message_truncate
from tests.factories import ChatSessionFactory, make_conversation
from tests.fixtures_llm import summary_of
from tests.helpers import context_payload

SMALL = ContextConfig(
    input_budget_runes=3000,
    threshold_pct=80,
    target_pct=50,
    summary_max_runes=500,
    min_verbatim=2,
    roll_batch=4,
)


@pytest.fixture
def small_budget(settings):
    settings.CHAT_CONTEXT = SMALL
    return SMALL


def tm(i: int, role: str, runes: int = 100, **kw) -> ctx.TailMessage:
    return ctx.TailMessage(
        id=i,
        role=role,
        content="x" * runes,
        tool_calls=kw.get("tool_calls"),
        tool_call_id=kw.get("tool_call_id", ""),
        runes=runes,
    )


# --- cut selection (no model) ------------------------------------------------------------


def test_cut_lands_on_a_turn_boundary_and_reaches_the_target():
    tail = []
    for t in range(10):
        tail += [tm(2 * t + 1, "user", 150), tm(2 * t + 2, "assistant", 150)]
    cut = ctx.context_choose_cut(tail=tail, system_runes_without_summary=50, summary="", cfg=SMALL)
    assert cut is not None and tail[cut].role == "user"
    remaining = sum(m.runes for m in tail[cut:])
    assert remaining + 50 + 500 <= SMALL.target_runes + 500  # target reached, with the summary
    # the shallowest such cut: one turn less would not reach the target
    shallower = cut - 2
    assert shallower <= 0 or sum(m.runes for m in tail[shallower:]) + 50 > SMALL.target_runes - 700


def test_cut_never_separates_a_tool_call_from_its_results():
    call = [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
    tail = [
        tm(1, "user", 400),
        tm(2, "assistant", 400, tool_calls=call),
        tm(3, "tool", 400, tool_call_id="c1"),
        tm(4, "assistant", 400),
        tm(5, "user", 100),
        tm(6, "assistant", 100),
    ]
    cut = ctx.context_choose_cut(tail=tail, system_runes_without_summary=0, summary="", cfg=SMALL)
    assert cut == 4  # before the second turn, never between 2 and 3


def test_min_verbatim_is_kept_and_a_single_turn_cannot_be_cut():
    cfg = ContextConfig(input_budget_runes=3000, min_verbatim=3, target_pct=50, threshold_pct=80)
    tail = [tm(1, "user", 3000), tm(2, "assistant", 3000), tm(3, "user", 10)]
    # cutting at index 2 would leave 1 < min_verbatim messages
    assert (
        ctx.context_choose_cut(tail=tail, system_runes_without_summary=0, summary="", cfg=cfg)
        is None
    )
    assert (
        ctx.context_choose_cut(
            tail=[tm(1, "user", 9000)], system_runes_without_summary=0, summary="", cfg=SMALL
        )
        is None
    )


# --- compaction against the fake LLM server ---------------------------------------------


def _long_session(turns: int = 12, words: int = 12) -> ChatSession:
    """Over the SMALL threshold (2400 runes) but under its hard limit, as a real session is when
    a send tips it over."""
    session = ChatSessionFactory.create()
    make_conversation(session, turns=turns, words=words)
    return session


@pytest.mark.django_db
def test_under_threshold_nothing_happens(fake_llm, small_budget):
    session = _long_session(turns=2, words=3)
    result = ctx.context_compact(session_id=session.pk, trigger="before_send")
    assert result.outcome == "skipped"
    assert fake_llm.count() == 0
    assert not ContextSnapshot.objects.exists()


@pytest.mark.django_db
def test_one_summarising_call_moves_the_anchor_to_the_target(fake_llm, small_budget):
    session = _long_session()
    before_ids = list(ChatMessage.objects.values_list("id", flat=True))
    fake_llm.script_summary(summary_of("talked about the first questions"))
    result = ctx.context_compact(session_id=session.pk, trigger="before_send")
    assert result.outcome == "committed", result
    assert fake_llm.count("summary") == 1 and result.llm_calls == 1
    session.refresh_from_db()
    anchor = ChatMessage.objects.get(pk=session.verbatim_since_message_id)
    assert anchor.role == MessageRole.USER  # a turn boundary
    assert session.context_summary.startswith("## Facts")
    assert session.context_version == 1
    assert list(ChatMessage.objects.values_list("id", flat=True)) == before_ids  # nothing deleted
    snap = ContextSnapshot.objects.get()
    assert snap.outcome == SnapshotOutcome.COMMITTED
    assert snap.summary_through_message_id < anchor.pk
    assert snap.runes_after < snap.runes_before
    state = ctx.context_state_read(session=session)
    assert state.runes <= SMALL.threshold_runes
    # the summary prompt carried the transcript of exactly the folded messages
    body = fake_llm.calls[-1].body
    prompt = body["messages"][1]["content"]
    assert f"[#{before_ids[0]} user]" in prompt
    assert f"[#{anchor.pk} user]" not in prompt


@pytest.mark.django_db
def test_summary_goes_into_the_system_prompt_under_the_prefix(fake_llm, small_budget):
    session = _long_session()
    fake_llm.script_summary(summary_of("SUMMARY-TEXT"))
    ctx.context_compact(session_id=session.pk, trigger="manual")
    payload = context_payload(session_id=session.pk, compact=False)
    system = payload.messages[0]
    assert system["role"] == "system"
    assert ctx.summary_block(summary=summary_of("SUMMARY-TEXT")) in system["content"]
    assert ctx.SUMMARY_PREFIX_EN + "\n" in system["content"]
    assert payload.messages[1]["role"] == "user"


@pytest.mark.django_db
def test_summary_prefix_follows_the_language(fake_llm, small_budget, settings):
    # A summary of no words at all (only numbers) says nothing: the server's language decides.
    settings.LANGUAGE_CODE = "zh-hans"
    assert ctx.system_text(system_prompt="P", summary="42").startswith(
        f"P\n\n{ctx.SUMMARY_PREFIX_ZH}\n"
    )
    # A summary in words decides for itself (tests/chat/test_summary_heading.py).
    assert ctx.SUMMARY_PREFIX_EN in ctx.system_text(system_prompt="P", summary="The user is Ann.")


@pytest.mark.parametrize(
    ("fault", "kwargs", "outcome"),
    [
        ("500", {"times": 10}, "failed"),
        ("hang", {"seconds": 5, "times": 10}, "failed"),
        ("invalid_json", {}, "failed"),
    ],
)
@pytest.mark.django_db
def test_a_failed_summary_changes_nothing_and_the_payload_still_fits(
    fake_llm, small_budget, settings, fault, kwargs, outcome
):
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 1.0
    session = _long_session(turns=14)
    before = list(ChatMessage.objects.order_by("id").values_list("id", "content"))
    fake_llm.fail_next(fault, target="summary", **kwargs)
    payload = context_payload(session_id=session.pk)
    assert payload.compactions[0].outcome == outcome
    session.refresh_from_db()
    assert session.verbatim_since_message_id is None
    assert session.context_summary == ""
    assert session.context_version == 0
    assert list(ChatMessage.objects.order_by("id").values_list("id", "content")) == before
    snap = ContextSnapshot.objects.get()
    assert snap.outcome == outcome and snap.error
    # cut for this call only: under the hard limit, oldest turns dropped, newest kept
    assert payload.runes <= SMALL.effective_hard_limit_runes
    assert payload.dropped > 0
    assert payload.messages[-1]["content"] == before[-1][1]
    # and the next send retries and succeeds
    fake_llm.reset()
    assert ctx.context_compact(session_id=session.pk, trigger="before_send").outcome == "committed"


@pytest.mark.django_db
def test_oversized_summary_is_recompressed_then_falls_back_if_still_too_long(
    fake_llm, small_budget
):
    session = _long_session()
    fake_llm.script_summary("y" * 900, summary_of("short enough"))
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert session.context_summary == summary_of("short enough")

    # Still over the cap once shortened: the extractive fallback is committed (the work of
    # the compaction is not thrown away), with no third call.
    fake_llm.script_summary("z" * 900, "w" * 900)
    result = ctx.context_compact(session_id=session.pk, trigger="manual", force=True)
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert len(session.context_summary) <= SMALL.summary_max_runes
    assert "short enough" in session.context_summary  # the previous summary carried over
    snap = ContextSnapshot.objects.filter(outcome="committed").latest("id")
    assert snap.model == "extractive-fallback" and "over the cap" in snap.error


@pytest.mark.django_db
def test_lost_compare_and_swap_commits_nothing(fake_llm, small_budget):
    session = _long_session()

    def meddle(*, session, messages):
        ChatSession.objects.filter(pk=session.pk).update(context_version=41)

    hooks.pre_compaction_hooks.append(meddle)
    try:
        result = ctx.context_compact(session_id=session.pk, trigger="before_send")
    finally:
        hooks.pre_compaction_hooks.remove(meddle)
    assert result.outcome == "conflict"
    session.refresh_from_db()
    assert session.context_summary == "" and session.verbatim_since_message_id is None
    assert ContextSnapshot.objects.get().outcome == SnapshotOutcome.CONFLICT


@pytest.mark.django_db
def test_a_failing_pre_roll_hook_blocks_the_roll(fake_llm, small_budget):
    session = _long_session()

    def broken_flush(*, session, messages):
        raise OSError("disk full")

    hooks.pre_compaction_hooks.append(broken_flush)
    try:
        result = ctx.context_compact(session_id=session.pk, trigger="before_send")
    finally:
        hooks.pre_compaction_hooks.remove(broken_flush)
    assert result.outcome == "failed"
    assert fake_llm.count() == 0  # no summary without its flush record
    session.refresh_from_db()
    assert session.verbatim_since_message_id is None


@pytest.mark.django_db
def test_held_lease_makes_a_second_compaction_a_no_op(fake_llm, small_budget):
    session = _long_session()
    token = lease_claim(session_id=session.pk, version=session.context_version)
    assert token
    assert ctx.context_compact(session_id=session.pk, trigger="before_send").outcome == "busy"
    assert fake_llm.count() == 0
    lease_release(session_id=session.pk, token=token)
    assert ctx.context_compact(session_id=session.pk, trigger="before_send").outcome == "committed"


@pytest.mark.django_db
def test_seed_mode_rolls_batch_by_batch(fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=3000,
        threshold_pct=80,
        target_pct=50,
        summary_max_runes=500,
        min_verbatim=2,
        roll_batch=4,
        strategy="seed",
    )
    seed_session = _long_session()
    seed = ctx.context_compact(session_id=seed_session.pk, trigger="before_send")
    settings.CHAT_CONTEXT = SMALL
    ours_session = _long_session()
    fake_llm.reset()
    ours = ctx.context_compact(session_id=ours_session.pk, trigger="before_send")
    assert seed.outcome == ours.outcome == "committed"
    assert ours.llm_calls == 1
    assert seed.llm_calls > ours.llm_calls
    assert seed.messages_rolled % 4 == 0  # fixed batches of roll_batch
    assert seed.rows_read == ChatMessage.objects.filter(session=seed_session).count()


@pytest.mark.django_db
@pytest.mark.parametrize("recall", [False, True])
def test_backlog_beyond_the_read_window_is_folded_in_chunks(fake_llm, settings, recall):
    """Without recall the whole backlog is summarised, in chunks; with it (the default) only its
    newest part is, in one or two calls, and the rest is archived as it is, for recall."""
    settings.CHAT_CONTEXT_RECALL = recall
    cfg = ContextConfig(
        input_budget_runes=3000,
        threshold_pct=80,
        target_pct=50,
        summary_max_runes=500,
        min_verbatim=2,
        history_read_limit=20,
    )
    settings.CHAT_CONTEXT = cfg
    session = _long_session(turns=60, words=2)  # 120 small messages, all verbatim
    state = ctx.context_state_read(session=session)
    assert state.backlog and state.rows_read == 20
    result = ctx.context_compact(session_id=session.pk, trigger="before_send")
    assert result.outcome == "committed"
    session.refresh_from_db()
    state = ctx.context_state_read(session=session)
    assert not state.backlog
    if recall:
        assert result.llm_calls <= 2
    else:
        assert result.messages_rolled >= 100


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("messages", "statements", "backlog"),
    [(30, 1, False), (40, 1, False), (41, 2, False), (200, 2, True)],
)
def test_the_tail_read_is_one_statement_a_page_and_knows_the_backlog_from_it(
    settings, monkeypatch, django_assert_num_queries, messages, statements, backlog
):
    """A never-compacted session is read newest-first, a page at a time, until the budget: each
    page fetches one row more than it keeps, which says whether older rows are left (the
    backlog) with no statement of its own, and a page that is exactly the rest of the tail
    needs no empty page after it."""
    import chat.context.state as state_module

    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=3000, min_verbatim=2)
    monkeypatch.setattr(state_module, "TAIL_PAGE_UNANCHORED", 40)
    session = ChatSessionFactory.create()
    for i in range(messages):
        role = MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT
        ChatMessage.objects.create(session=session, role=role, content="x" * 40)
    session.refresh_from_db()
    prompt = ctx.system_prompt_load(session=session)
    with django_assert_num_queries(statements):
        state = ctx.context_state_read(session=session, prompt=prompt)
    assert state.backlog is backlog
    assert state.rows_read == min(messages, 80)
    assert [m.id for m in state.tail] == sorted(m.id for m in state.tail)


@pytest.mark.django_db
def test_payload_never_exceeds_the_hard_limit_and_huge_messages_are_refused(fake_llm, small_budget):
    session = _long_session(turns=3)
    ChatMessage.objects.create(session=session, role="user", content="q" * 5000)
    with pytest.raises(ctx.PayloadTooLarge):
        context_payload(session_id=session.pk)


@pytest.mark.django_db
def test_a_long_reply_in_the_minimum_tail_is_shortened_for_the_call_not_dropped(settings):
    """The previous turn's reply is too long to send beside the new question (a summary
    cannot absorb it: it is in the minimum verbatim tail). The call gets its head and end
    around a marker, the question whole; the stored row is untouched (issue 13, item 3)."""
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=3000, min_verbatim=3)
    session = ChatSessionFactory.create()
    ChatMessage.objects.create(session=session, role="user", content="write me a long story")
    story = "Once upon a time. " + "The story goes on. " * 300 + "The end, said the fox."
    reply = ChatMessage.objects.create(session=session, role="assistant", content=story)
    ChatMessage.objects.create(session=session, role="user", content="who said the end?")
    payload = ctx.context_payload_build(state=ctx.context_state_fresh(session_id=session.pk))
    contents = [m["content"] for m in payload.messages[1:]]
    assert contents[0] == "write me a long story"
    assert contents[1].startswith("Once upon a time.") and contents[1].endswith("said the fox.")
    assert "characters of this message left out here" in contents[1]
    assert contents[2] == "who said the end?"
    assert payload.runes <= 3000 and payload.dropped == 0
    reply.refresh_from_db()
    assert reply.content == story


@pytest.mark.django_db
def test_a_question_too_long_alone_is_refused_not_shortened(settings):
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=3000, min_verbatim=3)
    session = ChatSessionFactory.create()
    ChatMessage.objects.create(session=session, role="assistant", content="a" * 2000)
    ChatMessage.objects.create(session=session, role="user", content="q" * 3500)
    with pytest.raises(ctx.PayloadTooLarge, match="newest message"):
        ctx.context_payload_build(state=ctx.context_state_fresh(session_id=session.pk))


@pytest.mark.django_db
def test_truncation_before_the_anchor_after_real_compactions_rewinds(fake_llm, small_budget):
    session = _long_session(turns=12)
    fake_llm.script_summary(summary_of("first summary"))
    assert ctx.context_compact(session_id=session.pk, trigger="manual").outcome == "committed"
    session.refresh_from_db()
    first_anchor = session.verbatim_since_message_id
    make_conversation(session, turns=12, words=12)
    fake_llm.script_summary(summary_of("second summary"))
    assert ctx.context_compact(session_id=session.pk, trigger="manual").outcome == "committed"
    session.refresh_from_db()
    assert session.verbatim_since_message_id > first_anchor
    # cut between the two anchors: the second summary describes deleted messages
    cut = ChatMessage.objects.filter(
        session=session, role="user", id__gt=first_anchor, id__lt=session.verbatim_since_message_id
    ).order_by("id")[1]
    result = message_truncate(session=session, message_id=cut.pk)
    assert result.summary_rewound
    session.refresh_from_db()
    assert session.context_summary == summary_of("first summary")
    assert session.verbatim_since_message_id == first_anchor


@pytest.mark.django_db
def test_a_later_tail_page_is_sized_from_the_runes_still_needed(
    settings, monkeypatch, django_assert_num_queries
):
    import chat.context.state as state_module

    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=3000, min_verbatim=2)
    monkeypatch.setattr(state_module, "TAIL_PAGE_UNANCHORED", 40)
    session = ChatSessionFactory.create()
    for i in range(100):
        role = MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT
        ChatMessage.objects.create(session=session, role=role, content="y" * 60)
    session.refresh_from_db()
    prompt = ctx.system_prompt_load(session=session)
    with django_assert_num_queries(2):
        state = ctx.context_state_read(session=session, prompt=prompt)
    # 40 rows held 2,400 of the ~2,900 runes: the second page is the least one, 20 rows, not
    # another 40.
    assert state.rows_read == 60
    assert state.backlog
