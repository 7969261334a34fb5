"""Automatic chat titles (chat/services/titles.py): an unnamed session is named when a reply
completes, by the summary model or from the first words, never over a name it has."""

from __future__ import annotations

import pytest

from chat.llm.base import SUMMARY_MARKER
from chat.models import ChatSession
from chat.services.titles import (
    TITLE_PROMPT,
    session_title_auto_set,
    title_clean,
    title_from_words,
)
from devtools.introspect import background_wait
from tests.chat.wsclient import login_cookie, until, ws_open
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import ChatSessionFactory

# Replies and title calls run in worker threads, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)
loop_left_clean = _loop_left_clean


def _send(api, session, content="hello"):
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def _title(session) -> str:
    return ChatSession.objects.get(pk=session.pk).title


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("How do I bake bread?", "How do I bake bread?"),
        ("\n\n  **Plan** a `trip`\nsecond line", "Plan a trip"),
        ("# Fix my_var in <b>main.py</b>", "Fix my_var in <b>main.py</b>"),
        ("> quoted _words_ here", "quoted words here"),
        ("1. first step", "first step"),
        (
            "Please compare the three cheapest ways to get from Lisbon to Porto next weekend by "
            "train or bus",
            "Please compare the three cheapest ways to get from Lisbon…",
        ),
        (
            "请帮我写一封给房东的邮件，说明下个月的房租会晚几天交，并表示歉意",
            "请帮我写一封给房东的邮件，说明下个月的房…",
        ),
        ("x" * 100, "x" * 60 + "…"),
        ("***", "***"),
        ("`", "`"),
        # One clean line, as the API requires of a title it is given.
        ("\x1b[31mred\x07 alert\x7f", "[31mred alert"),
    ],
)
def test_title_from_words(text, title):
    assert title_from_words(text) == title


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ("Baking Sourdough Bread", "Baking Sourdough Bread"),
        ('"Trip to Porto."', "Trip to Porto"),
        ("Title: **Rent email**\nextra words", "Rent email"),
        ("标题：给房东的邮件。", "给房东的邮件"),
        ("\n\n", ""),
        ("y" * 80, "y" * 60 + "…"),
        ("Bell\x07 and\x1b escape", "Bell and escape"),
    ],
)
def test_title_clean(answer, title):
    assert title_clean(answer) == title


def test_words_name_an_unnamed_session_once(api, owner, fake_llm, settings):
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.script("Sure.", "Again.")
    _send(api, session, "How do I bake bread?")
    assert _title(session) == "How do I bake bread?"
    _send(api, session, "And pizza?")
    assert _title(session) == "How do I bake bread?"
    assert fake_llm.count("summary") == 0


def test_a_name_the_user_gave_is_never_replaced(api, owner, fake_llm, settings):
    settings.CHAT_AUTO_TITLE = "model"
    session = ChatSessionFactory(owner=owner, title="Mine")
    fake_llm.script("Sure.")
    _send(api, session)
    background_wait()
    assert _title(session) == "Mine"
    assert fake_llm.count("summary") == 0
    # A rename that lands while a title is being worked out wins.
    unnamed = ChatSessionFactory(owner=owner, title="")
    api.patch(f"/api/v1/chat/sessions/{unnamed.pk}", {"title": "Renamed"}, format="json")
    assert session_title_auto_set(session_id=unnamed.pk, title="Auto") is False
    assert _title(unnamed) == "Renamed"


def test_the_summary_model_names_the_session_in_one_call(api, owner, fake_llm, settings):
    settings.CHAT_AUTO_TITLE = "model"
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.script("Knead, rest, bake.", "Use a hot stone.")
    fake_llm.script_summary("Baking Bread at Home")
    _send(api, session, "How do I bake bread?")
    background_wait()
    assert _title(session) == "Baking Bread at Home"
    call = next(c for c in fake_llm.calls if c.kind == "summary")
    system, user = call.body["messages"]
    assert system["content"] == TITLE_PROMPT and SUMMARY_MARKER in system["content"]
    assert "How do I bake bread?" in user["content"] and "Knead, rest, bake." in user["content"]
    assert call.body["model"] == "fake-summary" and call.body["max_tokens"] <= 32
    _send(api, session, "And pizza?")
    background_wait()
    assert fake_llm.count("summary") == 1


@pytest.mark.parametrize("failure", ["500", "refusal"])
def test_a_failed_title_call_falls_back_to_the_first_words(api, owner, fake_llm, settings, failure):
    settings.CHAT_AUTO_TITLE = "model"
    settings.LLM_MAX_RETRIES = 0
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.script("Sure.")
    if failure == "500":
        fake_llm.fail_next("500", target="summary")
    else:
        fake_llm.script_summary("I'm sorry, I can't help with that.")
    _send(api, session, "Write a haiku about rain")
    background_wait()
    assert _title(session) == "Write a haiku about rain"


def test_the_offline_provider_takes_the_words_without_a_call(api, owner, settings):
    from chat.llm import reset_provider

    settings.CHAT_AUTO_TITLE = "model"
    settings.LLM_BASE_URL = ""
    reset_provider()
    session = ChatSessionFactory(owner=owner, title="")
    _send(api, session, "Offline question here")
    assert _title(session) == "Offline question here"


def test_off_leaves_sessions_unnamed(api, owner, fake_llm, settings):
    settings.CHAT_AUTO_TITLE = "off"
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.script("Sure.")
    _send(api, session)
    assert _title(session) == ""


def test_a_failed_reply_names_nothing(api, owner, fake_llm, settings):
    settings.LLM_MAX_RETRIES = 0
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.fail_next("500", target="chat")
    _send(api, session)
    assert _title(session) == ""


async def test_the_socket_hears_the_new_title(owner, fake_llm):
    from channels.db import database_sync_to_async

    session = await database_sync_to_async(ChatSessionFactory)(owner=owner, title="")
    cookie = await database_sync_to_async(login_cookie)(owner)
    fake_llm.script("Sure.")
    ws = await ws_open(session.pk, cookie)
    await ws.send_json_to({"type": "send", "content": "Name this chat"})
    events = await until(ws, "title")
    assert events[-1] == {"type": "title", "session_id": session.pk, "title": "Name this chat"}
    assert [e["type"] for e in events].index("done") < len(events) - 1
    await ws.disconnect()


def test_a_message_of_markup_alone_still_names_the_session_once(api, owner, fake_llm, settings):
    settings.CHAT_AUTO_TITLE = "model"
    session = ChatSessionFactory(owner=owner, title="")
    fake_llm.script("One.", "Two.", "Three.")
    fake_llm.script_summary("***")  # the model answers with nothing usable either
    for _ in range(3):
        _send(api, session, "***")
        background_wait()
    assert _title(session) == "***"
    assert fake_llm.count("summary") == 1
