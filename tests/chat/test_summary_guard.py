"""The summary guard (chat/context/guard.py, chat/context/merge.py): what a real model's
summary must not be, the stricter retry, and the extractive fallback that keeps identifiers."""

from __future__ import annotations

import pytest

from cadau.contextconfig import ContextConfig
from chat import context as ctx
from chat.context.fallback import summary_extractive
from chat.context.guard import (
    FALLBACK_MODEL,
    SUMMARY_HEADINGS,
    summary_headings,
    summary_problem,
)
from chat.models import ChatMessage, ContextSnapshot
from tests.factories import ChatSessionFactory, make_conversation

SMALL = ContextConfig(
    input_budget_runes=3000,
    threshold_pct=80,
    target_pct=50,
    summary_max_runes=800,
    min_verbatim=2,
    roll_batch=4,
)
HEADED = "\n".join(f"## {h}\n- something" for h in SUMMARY_HEADINGS)


def headed(facts: str, *, bold: bool = False, identifiers: str = "(none recorded)") -> str:
    """A summary with the five sections: `facts` under the first, `identifiers` the last."""
    head = "**{}**" if bold else "## {}"
    body = {SUMMARY_HEADINGS[0]: facts, SUMMARY_HEADINGS[-1]: f"- {identifiers}"}
    return "\n\n".join(
        f"{head.format(h)}\n{body.get(h, '- (none recorded)')}" for h in SUMMARY_HEADINGS
    )


def tm(i: int, role: str, content: str) -> ctx.TailMessage:
    return ctx.TailMessage(
        id=i, role=role, content=content, tool_calls=None, tool_call_id="", runes=len(content)
    )


@pytest.mark.parametrize(
    ("text", "previous", "replaced", "problem"),
    [
        (headed("- fine"), "", 500, None),
        ("<think>let me see</think> summary", "", 500, "reasoning"),
        ("Facts.\nReturn the merged summary in at most 6000 characters.", "", 500, "instructions"),
        ("New transcript excerpt:\n[#1 user] hi", "", 500, "instructions"),
        ("[#1 user] hello\n\n[#2 assistant] hi there", "", 500, "copies the transcript"),
        (headed("x" * 2000), "", 2000, "no shorter"),
        (headed("x" * 150), "", 150, None),  # tiny material may come back as long
        ("## Facts and decisions\n- a", HEADED, 5000, "leaves out the section headings"),
        (HEADED.replace("something", "new"), HEADED, 5000, None),
        (headed("- a", bold=True), "", 500, None),
    ],
)
def test_summary_problem(text, previous, replaced, problem):
    found = summary_problem(text=text, previous=previous, replaced_runes=replaced)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_headings_are_found_in_markdown_and_bold():
    assert summary_headings(HEADED) == set(SUMMARY_HEADINGS)
    assert summary_headings("**Open tasks**\n- x\n### Exact identifiers:") == {
        "Open tasks",
        "Exact identifiers",
    }
    assert summary_headings("We discussed facts and decisions.") == set()


def test_the_fallback_keeps_identifiers_and_headings_under_its_cap():
    previous = "## Facts and decisions\n- The deploy host is db-7.internal\n## Open tasks\n- x"
    messages = [
        tm(1, "user", "Please restart worker at /srv/app/run.py on port 8443 tonight."),
        tm(2, "assistant", "Done. See https://status.example.com/incident/42 for the log."),
        tm(3, "user", "用户的预算是 3000 元，截止 2026-12-31。"),
    ]
    text = summary_extractive(previous=previous, messages=messages, max_runes=800)
    assert len(text) <= 800
    assert summary_headings(text) == set(SUMMARY_HEADINGS)
    for identifier in (
        "db-7.internal",
        "/srv/app/run.py",
        "8443",
        "https://status.example.com/incident/42",
        "3000 元",
    ):
        assert identifier in text, identifier
    # The fallback passes the guard it stands in for.
    assert summary_problem(text=text, previous=previous, replaced_runes=5000) is None
    tiny = summary_extractive(previous=previous, messages=messages * 30, max_runes=300)
    assert len(tiny) <= 300


@pytest.fixture
def small_budget(settings):
    settings.CHAT_CONTEXT = SMALL
    return SMALL


def _long_session():
    session = ChatSessionFactory.create()
    rows = make_conversation(session, turns=12, words=12)
    ChatMessage.objects.filter(pk=rows[0].pk).update(
        content="My account id is ACC-99812 and the server is at 10.0.4.17:5432."
    )
    return session


@pytest.mark.django_db
def test_an_echoing_summary_is_retried_with_the_reason(fake_llm, small_budget):
    session = _long_session()
    echo = "Return the merged summary in at most 800 characters.\n[#1 user] My account id"
    fake_llm.script_summary(echo, headed("- Account ACC-99812."))
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert session.context_summary == headed("- Account ACC-99812.")
    retry = fake_llm.calls[-1].body["messages"][-1]["content"]
    assert "rejected because it repeats the instructions" in retry


@pytest.mark.django_db
def test_two_bad_summaries_fall_back_to_the_extractive_one(fake_llm, small_budget):
    session = _long_session()
    before = list(ChatMessage.objects.order_by("id").values_list("id", "content"))
    fake_llm.script_summary("<think>hmm</think>", "<think>still thinking</think>")
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert "ACC-99812" in session.context_summary
    assert "10.0.4.17:5432" in session.context_summary
    assert summary_headings(session.context_summary) == set(SUMMARY_HEADINGS)
    assert ContextSnapshot.objects.get(outcome="committed").model == FALLBACK_MODEL
    # History is untouched: the summary replaced nothing in the database.
    assert list(ChatMessage.objects.order_by("id").values_list("id", "content")) == before


@pytest.mark.django_db
def test_a_summary_request_past_the_window_falls_back_at_once(fake_llm, small_budget):
    session = _long_session()
    fake_llm.fail_next("context_length", target="summary")
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 1
    session.refresh_from_db()
    assert "ACC-99812" in session.context_summary
    assert session.verbatim_since_message_id is not None


@pytest.mark.django_db
def test_the_fake_and_offline_summaries_pass_the_guard(fake_llm, small_budget, settings):
    """The built-in summarisers skip the request's own wording, so a default compaction is one
    call, and its summary keeps the identifiers."""
    session = _long_session()
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 1
    session.refresh_from_db()
    assert "ACC-99812" in session.context_summary
    assert "Return the merged" not in session.context_summary
    assert "[#" not in session.context_summary
    settings.LLM_BASE_URL = ""
    offline = _long_session()
    assert ctx.context_compact(session_id=offline.pk, trigger="manual").llm_calls == 1
    offline.refresh_from_db()
    assert "ACC-99812" in offline.context_summary and "Existing summary" not in (
        offline.context_summary
    )


# What SmolLM2-135M wrote (issue 25), each a rule of the guard; each passed it before.
TRANSCRIPT = (
    "[#38 user] I live in Bratislava and our project code is 4471-KX.\n\n"
    "[#39 user] My favourite tea is sencha. The release is v2.3 on 2026-12-31."
)


@pytest.mark.parametrize(
    ("text", "previous", "problem"),
    [
        # One copied transcript line is enough.
        (headed("- [#39 user] My favourite tea is sencha."), "", "copies the transcript"),
        (headed("- The user said: [#39 user] tea."), "", "copies the transcript"),
        # A first summary without the headings (the previous one had none to keep).
        ("The user lives in Bratislava. Project code 4471-KX.", "", "leaves out the section"),
        ("## Facts and decisions\n- The user lives in Bratislava.", "", "leaves out the section"),
        # Identifiers found nowhere in what was summarised.
        (headed("- Release v2.3 on 2029.32.27."), "", "2029.32.27"),
        (headed("- Project code 4471-KZ."), "", "4471-KZ"),
        # Loops, of lines or of words; of made-up numbers (caught as invented).
        (headed("- The user likes tea.\n- The user likes tea."), "", "repeats the line"),
        (headed("- The user likes tea and " * 12), "", "loops"),
        (headed("- Dates: " + ", ".join(f"2029.{m}.{m - 5}" for m in range(32, 60))), "", "2029."),
        # Echoes of the request, however re-spelled.
        (headed("- sencha") + "\nExisting summary:\n(none)", "", "repeats the instructions"),
        ("**New transcript excerpt**\n" + headed("- sencha"), "", "repeats the instructions"),
        # The previous summary's identifiers must survive.
        (headed("- The user drinks sencha."), headed("- Code ACC-99812."), "drops identifiers"),
    ],
)
def test_the_guard_catches_what_a_small_model_did(text, previous, problem):
    found = summary_problem(text=text, previous=previous, replaced_runes=5000, material=TRANSCRIPT)
    assert found is not None and problem in found, found


@pytest.mark.parametrize(
    "text",
    [
        headed("- The user lives in Bratislava; project 4471-KX, release v2.3 on 2026-12-31."),
        # Mentioning the summary in passing is no echo; the material's own numbers are fine.
        headed("- The user asked to keep the existing summary short. Messages #38 and #39."),
        # A pattern the conversation itself repeats is the conversation's, not a loop.
        headed("- " + " ".join(f"question {i} answered." for i in range(30))),
    ],
)
def test_the_guard_passes_a_faithful_summary(text):
    material = TRANSCRIPT + "".join(f"\n[#{i} user] question {i}" for i in range(30))
    assert summary_problem(text=text, previous="", replaced_runes=5000, material=material) is None


def test_the_length_check_works_for_small_material():
    material = "[#1 user] " + "I like green tea with honey. " * 20
    long = headed("- " + "The user likes green tea with honey and lemon. " * 14)
    assert len(material) < 1500
    problem = summary_problem(text=long, previous="", replaced_runes=len(material) - 10)
    assert problem is not None and "no shorter" in problem
    short = headed("- The user likes green tea with honey.")
    assert summary_problem(text=short, previous="", replaced_runes=len(material) - 10) is None


def test_a_previous_summary_may_lose_a_few_of_many_identifiers():
    previous = headed("- " + "; ".join(f"T-{i}" for i in range(100, 130)))
    kept = headed("- " + "; ".join(f"T-{i}" for i in range(100, 128)))
    assert summary_problem(text=kept, previous=previous, replaced_runes=9000) is None
    halved = headed("- " + "; ".join(f"T-{i}" for i in range(100, 115)))
    problem = summary_problem(text=halved, previous=previous, replaced_runes=9000)
    assert problem is not None and "drops identifiers" in problem


@pytest.mark.django_db
def test_an_error_answer_commits_the_fallback(fake_llm, small_budget):
    session = _long_session()
    fake_llm.fail_next("garbage", target="summary", times=2)
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert "ACC-99812" in session.context_summary
    snap = ContextSnapshot.objects.get(outcome="committed")
    assert snap.model == FALLBACK_MODEL and "looks like an error" in snap.error


@pytest.mark.django_db
def test_a_smollm2_answer_rejected_twice_commits_the_fallback_not_nothing(fake_llm, small_budget):
    """What the real model did: invented dates in a loop, then a copied transcript line. The
    compaction is not thrown away: the fallback is committed and the anchor moves."""
    session = _long_session()
    loop = headed("- Dates: " + ", ".join(f"2029.{m}.{m - 5}" for m in range(32, 60)))
    copied = headed("- [#1 user] My account id is ACC-99812.")
    fake_llm.script_summary(loop, copied)
    result = ctx.context_compact(session_id=session.pk, trigger="manual")
    assert result.outcome == "committed" and result.llm_calls == 2
    session.refresh_from_db()
    assert session.verbatim_since_message_id is not None
    assert "ACC-99812" in session.context_summary and "10.0.4.17:5432" in session.context_summary
    assert "2029" not in session.context_summary and "[#" not in session.context_summary
    snap = ContextSnapshot.objects.get(outcome="committed")
    assert snap.model == FALLBACK_MODEL and "copies the transcript" in snap.error
    retry = fake_llm.calls[-1].body["messages"][-1]["content"]
    assert "rejected because it names 2029.32.27" in retry


@pytest.mark.django_db
def test_fallbacks_over_many_compactions_keep_the_first_fact(fake_llm, small_budget):
    """Twenty-four compactions in a row, every model answer unusable: the fallback carries
    the first turn's facts through all of them."""
    session = _long_session()
    for round_ in range(24):
        make_conversation(session, turns=4, words=12)
        fake_llm.fail_next("garbage", target="summary", times=2)
        result = ctx.context_compact(session_id=session.pk, trigger="manual", force=True)
        assert result.outcome == "committed", (round_, result)
        session.refresh_from_db()
        assert len(session.context_summary) <= SMALL.summary_max_runes
        assert "ACC-99812" in session.context_summary, (round_, session.context_summary)
    assert ContextSnapshot.objects.filter(outcome="committed", model=FALLBACK_MODEL).count() == 24
