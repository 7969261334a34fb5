"""The model's window in the budget (chat/llm/window.py, chat/context/state.py): the token
estimate corrected by what the provider reports, and the window a server states up front."""

from __future__ import annotations

import pytest

from cadau.contextconfig import ContextConfig
from chat.context import (
    PayloadTooLarge,
    context_payload_build,
    context_state_fresh,
    context_window_probe_start,
)
from chat.llm import window
from chat.models import ChatMessage, MessageRole
from devtools.introspect import tokens_factors
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_factors_are_averages_by_script_that_ignore_nonsense():
    english, chinese = "word " * 60, "汉字" * 20  # 100 tokens each by the default guess
    assert window.tokens_estimate(english, model="m") == 101
    assert window.tokens_estimate(chinese, model="m") == 101
    assert window.tokens_learn(model="m", text=english, reported=50) == pytest.approx(0.5, abs=0.01)
    assert set(tokens_factors(model="m")) == {"other"}
    learned = tokens_factors(model="m")["other"]
    assert (
        window.tokens_estimate(english, model="m") == int(100 * learned * window.FACTOR_MARGIN) + 1
    )
    # One reading moves the average part of the way.
    assert window.tokens_learn(model="m", text=english, reported=150) == pytest.approx(
        0.5 + 0.3 * (1.5 - 0.5), abs=0.01
    )
    # Chinese is learned apart: English's factor does not change what a character costs.
    assert window.tokens_estimate(chinese, model="m") == 101
    assert window.tokens_learn(model="m", text=chinese + "ab", reported=200) == pytest.approx(
        2.0, rel=0.05
    )
    assert set(tokens_factors(model="m")) == {"other", "cjk"}
    # Readings no tokenizer gives (usage of some other request, a proxy's count) are ignored.
    assert window.tokens_learn(model="m", text=english, reported=1) is None
    assert window.tokens_learn(model="m", text=english, reported=10_000) is None
    assert window.tokens_learn(model="m", text="", reported=10) is None
    assert tokens_factors(model="other") == {}  # per model


def test_mixed_prompts_teach_each_script_its_own_cost():
    """English learned first, then turns that mix English with a dearer Chinese part (SmolLM2:
    ~5.7 English characters a token, 2-3 tokens a Chinese character). Filed whole under the
    script most of the prompt is in, every mixed reading made English dearer and left Chinese
    at its guess: a Chinese turn was then under-estimated and overflowed the window (issue 25).
    Fitted together, each script gets its own cost."""

    def served(text: str) -> int:  # the tokenizer: 0.5 of our English guess, 3 a CJK character
        cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
        return int(cjk * 3 + (len(text) - cjk) / 3 * 0.5)

    english = "the beans climb the old ladder by the fence " * 20
    for _ in range(3):
        window.tokens_learn(model="m", text=english, reported=served(english))
    for i in range(8):
        # Mostly English by estimate, a fifth to a third Chinese.
        mixed = english + "我的花园里有番茄豆子和香草" * (6 + 2 * (i % 3))
        window.tokens_learn(model="m", text=mixed, reported=served(mixed))
    chinese = "番茄种在南边的篱笆旁豆子爬在旧梯子上" * 20
    # Never under what the server counts (that overflows), and close to it.
    assert served(chinese) <= window.tokens_estimate(chinese, model="m") <= served(chinese) * 1.25
    assert served(english) <= window.tokens_estimate(english, model="m") <= served(english) * 1.25


def test_a_cjk_character_is_estimated_at_the_dear_end_until_learned():
    """SmolLM2 charges 2-3 tokens a Chinese character: unlearned, the estimate takes the dear
    end, so a Chinese turn fits the window it is measured against."""
    assert window.tokens_estimate("花" * 100, model="m") >= 250


def test_a_refusal_states_the_prompts_tokens():
    llama_cpp_python = (
        "This model's maximum context length is 1024 tokens. However, you requested 1551 tokens "
        "(1531 in the messages, 20 in the completion). Please reduce the length of the messages."
    )
    assert window.tokens_from_error(llama_cpp_python) == 1531
    openai = (
        "maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    )
    assert window.tokens_from_error(openai) == 9000
    assert window.tokens_from_error("Requested tokens (1531) exceed context window of 1024") == 1531
    assert window.tokens_from_error("the model is overloaded") is None


def _send(api, session, content):
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def test_a_reply_teaches_the_estimate_and_the_limit_follows(api, owner, fake_llm, settings):
    """The fake counts 4 characters per token; our default estimate assumes 3 for English, so
    after one reply the limit in runes grows by about 4/3 (less the margin)."""
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=48_000, window_tokens=2000)
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=3, words=20)
    first = _send(api, session, "an English question about the weather")
    assert first["context_budget"]["binding"] == "window"
    usage = first["assistant_message"]["metadata"]["usage"]
    sent = "".join(m["content"] for m in fake_llm.calls[-1].body["messages"])
    reading = usage["prompt_tokens"] / (len(sent) / 3)
    assert 0.6 < reading < 0.9  # 3/4
    assert tokens_factors(model="fake-chat")["other"] == pytest.approx(reading, rel=0.01)
    second = _send(api, session, "another English question about the sea")
    grown = second["context_budget"]["limit_runes"] / first["context_budget"]["limit_runes"]
    assert grown == pytest.approx(1 / (reading * window.FACTOR_MARGIN), rel=0.05)


def test_without_a_window_nothing_is_estimated(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    body = _send(api, session, "hello")
    assert "binding" not in body["context_budget"]
    assert tokens_factors(model="fake-chat") == {}


@pytest.mark.parametrize(
    ("listing", "window_tokens"),
    [
        ({"data": [{"id": "m", "max_model_len": 8192}]}, 8192),  # vLLM
        ({"data": [{"id": "m", "context_length": 32768}]}, 32768),  # LM Studio, OpenRouter
        ({"data": [{"id": "/models/x.gguf", "meta": {"n_ctx": 4096}}]}, 4096),  # one model
        ({"data": [{"id": "other", "max_model_len": 8192}, {"id": "m2"}]}, None),
        ({"data": [{"id": "m", "meta": {"n_ctx_train": 8192}}]}, None),  # trained, not run
        ({"data": [{"id": "m", "max_model_len": True}]}, None),
        ({"object": "list"}, None),
        ("not json", None),
    ],
)
def test_window_from_models(listing, window_tokens):
    assert window.window_from_models(listing, model="m") == window_tokens


def test_a_window_the_server_states_is_used_before_any_refusal(api, owner, fake_llm):
    """The fake states its window in /v1/models as vLLM and llama.cpp do: after the first
    send asks (in the background), sends are built for it and none is refused."""
    import time

    fake_llm.configure(context_window=700)
    session = ChatSessionFactory(owner=owner)
    _send(api, session, "hi")  # small enough to fit; asks for the window meanwhile
    deadline = time.monotonic() + 5
    while window.window_learned_get(model="fake-chat") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert window.window_learned_get(model="fake-chat") == 700
    make_conversation(session, turns=12, words=40)
    before = fake_llm.count("chat")
    body = _send(api, session, "a question after a long conversation")
    assert body["assistant_message"]["status"] == "complete"
    assert body["context_budget"]["binding"] == "window"
    assert fake_llm.count("chat") == before + 1  # fitted at once: no refusal, no retry


def test_the_window_probe_is_started_by_its_caller_not_by_a_read(owner, fake_llm, monkeypatch):
    """Asking the server is network I/O: a read of the context never starts it, the send does
    (context_window_probe_start), and not for a window the configuration gives."""
    from chat.context import state

    asked: list[str] = []
    monkeypatch.setattr(state, "window_probe_start", lambda *, model, fetch: asked.append(model))
    session = ChatSessionFactory(owner=owner)
    context_state_fresh(session_id=session.pk)
    assert asked == []
    context_window_probe_start(session=session)
    assert asked == ["fake-chat"]


def test_a_configured_window_is_not_asked_for(owner, fake_llm, settings, monkeypatch):
    from chat.context import state

    asked: list[str] = []
    monkeypatch.setattr(state, "window_probe_start", lambda *, model, fetch: asked.append(model))
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=48_000, window_tokens=2000)
    context_window_probe_start(session=ChatSessionFactory(owner=owner))
    assert asked == []


def test_a_server_without_a_models_route_changes_nothing(api, owner, fake_llm, monkeypatch):
    from chat.llm.openai_compat import OpenAICompatProvider

    def broken(self):
        raise RuntimeError("404 Not Found")

    monkeypatch.setattr(OpenAICompatProvider, "models_listing", broken)
    session = ChatSessionFactory(owner=owner)
    assert _send(api, session, "hi")["assistant_message"]["status"] == "complete"


def test_a_window_implied_by_an_overflow_follows_what_is_learned_later():
    """A refusal without a figure: the window is under that prompt. Met before the tokenizer is
    known, our guess overstates English tokens; once a factor is learned the window follows."""
    english = "word " * 600  # 1000 tokens by the default guess
    window.window_record_overflow(model="m", text=english)
    first = window.window_learned_get(model="m")
    assert first is not None and 790 <= first <= 801
    window.tokens_learn(model="m", text=english, reported=500)  # the tokenizer: half our guess
    learned = tokens_factors(model="m")["other"]
    assert learned == pytest.approx(0.5, abs=0.01)
    assert window.window_learned_get(model="m") == int(1000 * learned * window.FACTOR_MARGIN * 0.8)
    # A stated window still wins when it is smaller.
    window.window_record_stated(model="m", tokens=300)
    assert window.window_learned_get(model="m") == 300


def test_a_turn_in_a_cheaper_script_fits_where_the_average_says_it_does_not(owner, settings):
    """A Chinese conversation (2 tokens a character) then a long English message (a token per
    3 characters): at the conversation's average runes per token the English turn is over the
    rune limit, yet it takes about 400 of the 750 tokens the window leaves. The payload is
    measured in tokens, so it is sent (the older Chinese turns dropped from this call), not
    failed as too large (CI run of issue 13: 'the newest turn needs 1100 runes, over the hard
    limit of 666')."""
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=48_000, window_tokens=1000)
    session = ChatSessionFactory(owner=owner)
    for role in (MessageRole.USER, MessageRole.ASSISTANT) * 2:
        ChatMessage.objects.create(session=session, role=role, content="花园" * 75)
    english = "the beans climb the old ladder by the fence " * 27  # ~1,200 characters
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content=english)
    state = context_state_fresh(session_id=session.pk)
    assert state.binding == "window"
    assert state.input_tokens == 750
    assert len(english) > state.cfg.effective_hard_limit_runes  # the average says no
    payload = context_payload_build(state=state)
    assert payload.messages[-1]["content"] == english
    assert payload.dropped > 0
    sent = "".join(str(m["content"]) for m in payload.messages)
    assert window.tokens_estimate(sent) <= 750


def test_a_turn_over_the_window_in_tokens_is_still_refused(owner, settings):
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=48_000, window_tokens=1000)
    session = ChatSessionFactory(owner=owner)
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="花" * 400)
    state = context_state_fresh(session_id=session.pk)
    with pytest.raises(PayloadTooLarge, match="over the 750"):
        context_payload_build(state=state)


def test_a_message_the_window_cannot_hold_is_refused_before_it_is_stored(
    api, owner, fake_llm, settings
):
    """400 Chinese characters are ~1,000 tokens: over the 750 a 1,000-token window leaves, though
    far under the rune budget. Refused like any message over a limit: a 400, nothing stored,
    no model call."""
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=48_000, window_tokens=1000)
    session = ChatSessionFactory(owner=owner)
    r = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "花" * 400}, format="json"
    )
    assert r.status_code == 400, r.content
    assert "context window" in r.json()["error"]["message"]
    assert not ChatMessage.objects.filter(session=session).exists()
    assert fake_llm.calls == []
    assert _send(api, session, "花" * 250)["assistant_message"]["status"] == "complete"
