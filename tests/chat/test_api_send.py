"""POST /api/v1/chat/send (JSON and server-sent events), regenerate and compact-now, with the
real httpx client talking to the fake LLM server."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from cadau.contextconfig import ContextConfig
from chat.models import ChatMessage, ChatSession
from tests.factories import ChatSessionFactory, make_conversation
from tests.fixtures_llm import summary_of
from tests.helpers import replies_wait, send_streaming, sse_events, sse_parse

# The reply runs through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_send_stores_both_messages_and_returns_the_budget(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("Hello there, human.")
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["user_message"]["content"] == "hi"
    assert body["assistant_message"]["content"] == "Hello there, human."
    assert body["assistant_message"]["status"] == "complete"
    assert set(body["context_budget"]) == {"used_runes", "limit_runes", "used_pct"}
    assert body["context_budget"]["used_runes"] > 0
    session.refresh_from_db()
    assert session.message_count == 2
    # the model saw the system prompt and the user's message
    sent = fake_llm.calls[-1].body["messages"]
    assert sent[0]["role"] == "system" and sent[-1] == {"role": "user", "content": "hi"}


def test_same_client_id_twice_creates_one_message(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    payload = {"session_id": session.pk, "content": "once", "client_id": "abc-1"}
    first = api.post("/api/v1/chat/send", payload, format="json").json()
    before = ChatSession.objects.get(pk=session.pk).last_activity_at
    second = api.post("/api/v1/chat/send", payload, format="json").json()
    assert first["user_message"]["id"] == second["user_message"]["id"]
    assert first["assistant_message"]["id"] == second["assistant_message"]["id"]
    assert ChatMessage.objects.filter(session=session).count() == 2
    assert fake_llm.count("chat") == 1
    # The repeat's stamp (the UPDATE that takes the session's lock) was rolled back.
    stamped = ChatSession.objects.get(pk=session.pk)
    assert stamped.message_count == 2
    assert stamped.last_activity_at == before


def test_event_stream_follows_the_websocket_contract(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("one two three")
    r = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "stream please"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/event-stream")
    events = sse_events(r)
    types = [e["type"] for e in events]
    assert types[0] == "message" and types[-1] == "done"
    assert "delta" in types
    text = "".join(e["text"] for e in events if e["type"] == "delta")
    assert text == "one two three"
    done = events[-1]
    assert done["message"]["content"] == "one two three"
    assert done["message"]["status"] == "complete"
    assert "context_budget" in done


def test_upstream_failure_keeps_the_user_message_and_marks_the_reply_failed(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.fail_next("500", times=10, target="chat")
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}, format="json")
    assert r.status_code == 200
    body = r.json()
    assert body["user_message"]["content"] == "hi"
    assert body["assistant_message"]["status"] == "failed"
    assert body["assistant_message"]["metadata"]["error_code"] == "llm_error"
    # retry via regenerate once the model is back
    fake_llm.reset()
    fake_llm.script("better now")
    r = api.post("/api/v1/chat/regenerate", {"session_id": session.pk}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["assistant_message"]["content"] == "better now"
    assert ChatMessage.objects.filter(session=session).count() == 2


def test_stream_cut_mid_reply_stores_the_partial_text_as_failed(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("alpha beta gamma delta epsilon")
    fake_llm.fail_next("cut", target="chat", after_tokens=2)
    body = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}, format="json"
    ).json()
    reply = body["assistant_message"]
    assert reply["status"] == "failed"
    assert reply["content"] and "epsilon" not in reply["content"]
    assert reply["metadata"]["error_code"] == "llm_stream_cut"


def test_context_length_error_compacts_and_retries(api, owner, fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=20000, summary_max_runes=500, min_verbatim=2
    )
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=10, words=20)
    fake_llm.fail_next("context_length", target="chat")
    fake_llm.script_summary(summary_of("compact summary"))
    fake_llm.script("fits now")
    body = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "go"}, format="json"
    ).json()
    assert body["assistant_message"]["content"] == "fits now"
    session.refresh_from_db()
    assert session.context_summary == summary_of("compact summary")
    assert fake_llm.count("summary") == 1


def test_send_over_the_threshold_compacts_first(api, owner, fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=3000,
        threshold_pct=80,
        target_pct=50,
        summary_max_runes=500,
        min_verbatim=2,
    )
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=12, words=30)
    fake_llm.script_summary(summary_of("rolled up"))
    r = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "next"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    events = sse_events(r)
    states = [e["state"] for e in events if e["type"] == "compaction"]
    assert states == ["started", "done"]
    end = [e for e in events if e["type"] == "compaction"][-1]
    # The ring moves when the compaction ends, before the reply's first token.
    assert end["outcome"] == "committed" and end["messages_rolled"] > 0
    assert end["context_budget"]["used_runes"] < 3000 * 0.8
    assert events[-1]["context_budget"]["used_runes"] <= 3000
    sent = [c for c in fake_llm.calls if c.kind == "chat"][-1].body["messages"]
    assert "rolled up" in sent[0]["content"]


@pytest.mark.parametrize("turns", [12, 40])
def test_with_background_compaction_no_send_waits_for_a_summary(
    api, owner, fake_llm, settings, turns
):
    """A session found past the threshold (12 turns) or even past the hard limit (40 turns,
    as an import leaves it: never summarised) is answered at once, from the payload as it is
    or trimmed to the hard limit, and compacted in the background meanwhile."""
    from devtools.introspect import background_wait

    settings.CHAT_BACKGROUND_COMPACTION = True
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=3000,
        threshold_pct=80,
        target_pct=50,
        summary_max_runes=500,
        min_verbatim=2,
    )
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=turns, words=30)
    fake_llm.script("answered at once")
    events = sse_events(
        api.post(
            "/api/v1/chat/send",
            {"session_id": session.pk, "content": "next"},
            format="json",
            HTTP_ACCEPT="text/event-stream",
        )
    )
    done = events[-1]
    assert done["message"]["content"] == "answered at once"
    assert done["message"]["metadata"]["summary_calls_waited"] == 0
    assert [e for e in events if e["type"] == "compaction"] == []
    chat = next(c for c in fake_llm.calls if c.kind == "chat").body["messages"]
    assert sum(len(m["content"]) for m in chat) <= 3000
    assert chat[-1] == {"role": "user", "content": "next"}
    background_wait()
    session.refresh_from_db()
    assert session.context_summary and session.verbatim_since_message_id is not None
    assert fake_llm.count("summary") >= 1
    # The compaction started only once the reply's first token was out (bench ttft).
    kinds = [c.kind for c in fake_llm.calls]
    assert kinds.index("chat") < kinds.index("summary")


def test_bad_input_is_a_400_and_stores_nothing(api, owner, fake_llm, settings):
    session = ChatSessionFactory(owner=owner)
    for body in (
        {"session_id": session.pk, "content": ""},
        {"session_id": session.pk, "content": "   "},
        {"session_id": "x", "content": "hi"},
        {"session_id": session.pk},
        {"session_id": session.pk, "content": "hi", "client_id": "x" * 65},
        {"session_id": session.pk, "content": "q" * 60_000},
    ):
        r = api.post("/api/v1/chat/send", body, format="json")
        assert r.status_code == 400, (body, r.content)
        assert "error" in r.json() and r.json()["error"]["code"]
    assert ChatMessage.objects.count() == 0
    assert fake_llm.count() == 0


def test_outsider_cannot_send_regenerate_or_compact(outsider_api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    for url, body in (
        ("/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}),
        ("/api/v1/chat/regenerate", {"session_id": session.pk}),
        (f"/api/v1/chat/sessions/{session.pk}/compact", {}),
    ):
        r = outsider_api.post(url, body, format="json")
        assert r.status_code == 404, (url, r.content)
    assert ChatMessage.objects.count() == 0


def test_compact_now_with_instructions(api, owner, fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=20000, summary_max_runes=500, min_verbatim=2
    )
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=6, words=10)
    fake_llm.script_summary(summary_of("kept the numbers"))
    r = api.post(
        f"/api/v1/chat/sessions/{session.pk}/compact",
        {"instructions": "keep the numbers"},
        format="json",
    )
    assert r.status_code == 200, r.content
    assert r.json()["context_summary"] == summary_of("kept the numbers")
    assert "keep the numbers" in fake_llm.calls[-1].body["messages"][1]["content"]
    make_conversation(session, turns=6, words=10)
    fake_llm.fail_next("500", times=10, target="summary")
    r = api.post(f"/api/v1/chat/sessions/{session.pk}/compact", {}, format="json")
    assert r.status_code == 502 and r.json()["error"]["code"] == "compaction_failed"
    assert ChatSession.objects.get(pk=session.pk).context_summary == summary_of("kept the numbers")


def test_offline_provider_answers_without_any_network(api, owner, settings):
    settings.LLM_BASE_URL = ""
    from chat.llm import reset_provider

    reset_provider()
    session = ChatSessionFactory(owner=owner)
    body = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "hello"}, format="json"
    ).json()
    assert body["assistant_message"]["status"] == "complete"
    assert "LLM_BASE_URL" in body["assistant_message"]["content"]


def test_a_reply_orphaned_after_the_startup_sweep_is_failed_by_the_next_send(api, owner, fake_llm):
    from datetime import timedelta

    from django.utils import timezone

    session = ChatSessionFactory.create(owner=owner)
    ChatMessage.objects.create(session=session, role="user", content="before the crash")
    orphan = ChatMessage.objects.create(
        session=session, role="assistant", content="half a repl", status="streaming"
    )
    ChatMessage.objects.filter(pk=orphan.pk).update(
        updated_at=timezone.now() - timedelta(minutes=5)
    )
    fake_llm.script("fresh answer")
    body = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "again"}, format="json"
    ).json()
    assert body["assistant_message"]["content"] == "fresh answer"
    orphan.refresh_from_db()
    assert orphan.status == "failed" and orphan.content == "half a repl"
    assert "interrupted" in orphan.metadata["error"]


def test_a_prompt_past_the_models_window_is_recovered_and_the_window_learned(api, owner, fake_llm):
    """A llama.cpp-style server ends the stream before its first event when the prompt does
    not fit its window (docs/real-llm-notes.md): Cadau learns a window, compacts, and the reply
    still comes; the next send is built for the window and is not refused at all."""
    fake_llm.configure(context_window=700)  # tokens; the default rune budget is far larger
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=12, words=40)
    first = send_streaming(api, session, "first question")
    assert first[-1]["message"]["status"] == "complete", first[-1]["message"]["metadata"]
    assert first[-1]["context_budget"]["binding"] == "window"
    refused = fake_llm.count("chat")
    second = send_streaming(api, session, "second question")
    assert second[-1]["message"]["status"] == "complete"
    assert fake_llm.count("chat") == refused + 1  # fitted at once


@pytest.mark.django_db
@pytest.mark.parametrize("cap", [4, 0])
def test_the_stamp_says_whether_a_reply_streams_so_a_quiet_send_skips_that_read(
    settings, owner, cap
):
    """turn_store's stamp UPDATE also answers "is any reply streaming where the busy check
    looks?": on the usual send (none is) the streaming rows are not read at all; with one
    streaming they are, and the send is refused as busy."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.errors import ReplyInProgress
    from chat.turn.checks import SendRequest
    from chat.turn.rows import turn_store

    settings.CHAT_MAX_CONCURRENT_REPLIES = cap
    session = ChatSessionFactory.create(owner=owner)

    def store(content: str) -> list[str]:
        send = SendRequest(user=owner, session_id=session.pk, content=content, client_id=None)
        with CaptureQueriesContext(connection) as queries:
            turn_store(send=send)
        return [q["sql"] for q in queries.captured_queries]

    quiet = store("first")
    assert not any("streaming" in sql and sql.startswith("SELECT") for sql in quiet)
    # The first send's reply row is still `streaming` (nothing generated it here): busy.
    with pytest.raises(ReplyInProgress):
        store("second")
    session.refresh_from_db()
    assert session.message_count == 2  # the refused send's stamp was rolled back


@pytest.mark.django_db
def test_a_queued_send_given_up_during_its_trip_stores_nothing(owner):
    """The queue asks `abandoned` before each trip, and turn_store asks it again under the lock
    once the session is free: a login that ended while the trip waited for a thread (and the
    reply it queued behind ended meanwhile) stores nothing."""
    from chat.errors import NotFound
    from chat.turn.checks import SendRequest
    from chat.turn.rows import turn_store

    session = ChatSessionFactory.create(owner=owner)
    send = SendRequest(user=owner, session_id=session.pk, content="queued", client_id=None)
    with pytest.raises(NotFound):
        turn_store(send=send, abandoned=lambda: True)
    assert not ChatMessage.objects.filter(session=session).exists()
    session.refresh_from_db()
    assert session.message_count == 0


@pytest.mark.parametrize("recovers", [True, False])
def test_a_stream_whose_final_write_fails_ends_with_error_and_done(
    api, owner, fake_llm, monkeypatch, recovers
):
    """The model answered, then the database failed at the reply's final write (a restart):
    the stream still ends with `error` and `done`, never with a bare end of the response. Once
    the database answers again, the reply is stored `failed` with the text that arrived."""
    from django.db import OperationalError

    from chat.turn import failures, generate

    session = ChatSessionFactory(owner=owner)
    fake_llm.script("one two three")
    monkeypatch.setattr(failures, "UNEXPECTED_STORE_WAITS", (0.0, 0.01))
    real_failed = failures.reply_result_failed

    def complete_fails(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    def failed_store(**kwargs):
        if not recovers:
            raise OperationalError("the database system is starting up")
        return real_failed(**kwargs)

    monkeypatch.setattr(generate, "reply_result_complete", complete_fails)
    monkeypatch.setattr(failures, "reply_result_failed", failed_store)
    events = send_streaming(api, session, "hi")
    assert [e["type"] for e in events[-2:]] == ["error", "done"]
    assert events[-2]["code"] == "server_error"
    done = events[-1]["message"]
    assert done["status"] == "failed" and done["content"] == "one two three"
    reply = ChatMessage.objects.get(pk=done["id"])
    if recovers:
        assert reply.status == "failed" and reply.content == "one two three"
    else:  # left to the sweep; the stream was told all the same
        assert reply.status == "streaming"


def test_a_burst_s_first_token_is_written_before_the_rest_is_read(
    api, owner, fake_llm, monkeypatch
):
    """A server that sends a whole reply at once: its first token goes out to the client
    before the rest of the burst is parsed and published (chat/turn/stream.py). Without the
    handoff this fails here (the whole reply was published before the first write); that is
    not asserted, as whether the fake's chunks come in one read is up to the machine."""
    from chat.turn import stream
    from chat.turn.registry import Generation

    # Longer than the default: a loaded machine cannot make it flaky.
    monkeypatch.setattr(stream, "FIRST_TOKEN_HANDOFF_SECONDS", 0.05)
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("one two three four five six")
    order: list[str] = []
    publish = Generation.publish

    def noted(self, event):
        if event["type"] == "delta":
            order.append("published")
        publish(self, event)

    monkeypatch.setattr(Generation, "publish", noted)
    r = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "burst please"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )

    async def collect() -> None:
        async for chunk in r.streaming_content:
            order.extend("written" for e in sse_parse(chunk.decode()) if e["type"] == "delta")
        await replies_wait()

    async_to_sync(collect)()
    assert order.count("published") > 2  # the fake sends a token a chunk
    second = order.index("published", order.index("published") + 1)
    assert "written" in order[:second]


@pytest.mark.parametrize("path", ["/api/v1/chat/send", "/api/v1/chat/regenerate"])
def test_an_error_to_a_client_asking_for_a_stream_is_json_and_says_so(api, outsider_api, path):
    """Rendered by the event-stream renderer, it was JSON text labelled text/event-stream."""
    bad = api.post(path, {"session_id": "x"}, format="json", HTTP_ACCEPT="text/event-stream")
    body = {"session_id": 10**9, **({"content": "hi"} if path.endswith("send") else {})}
    gone = outsider_api.post(path, body, format="json", HTTP_ACCEPT="text/event-stream")
    for response, status in ((bad, 400), (gone, 404)):
        assert response.status_code == status
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"]
