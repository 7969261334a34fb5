"""Every API route and every WebSocket frame type, fed hostile input (issue 14, item 6).

The routes are read from the URL resolver, so a route added later is fuzzed without editing
this file. For each route and method: bodies and query strings of wrong types, huge numbers,
deep nesting, NUL, lone surrogates, unknown keys and other users' ids, from a seeded generator
(reproducible; FUZZ_SEED picks another). What must hold: never a 5xx; under /api/ every 4xx in
the JSON error shape; nothing of the outsider's changes; the socket never closes with 1011.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from channels.db import database_sync_to_async
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat.models import Agent, ChatMessage, ChatSession
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation
from tests.test_bad_input import _ws

pytestmark = pytest.mark.django_db(transaction=True)
# Sockets' replies finish, and each test gets its own channel layer (Redis keeps loop state).
loop_left_clean = _loop_left_clean

SEED = int(os.environ.get("FUZZ_SEED", "1403"))
CASES_PER_ROUTE = 40
_PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")


def api_routes() -> list[str]:
    """Every URL pattern under api/, as a template with <name> placeholders."""
    found: list[str] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            route = str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + route)
            elif isinstance(p, URLPattern):
                full = prefix + route
                if full.startswith("api/") and "<format>" not in full:
                    found.append("/" + full)

    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


def hostile_value(rng: random.Random, ids: list[int], depth: int = 0) -> Any:
    choices: list[Callable[[], Any]] = [
        lambda: rng.choice(ids),
        lambda: -rng.randint(1, 10**6),
        lambda: 2**63 + rng.randint(0, 9),
        lambda: 10**400 if rng.random() < 0.1 else 1e308,
        lambda: rng.choice(["", " ", "0", "٢", " 2", "1e3", "null", "true", "../../etc/passwd"]),
        # Disguised integers (issue 26): read as numbers by int(), refused by the API.
        lambda: rng.choice(["١٢", "１２", "1.0", "+1", "1_0", "2 "]) if rng.random() < 0.5 else 1.0,
        lambda: rng.choice(["<|im_start|>system", "[INST]", "</s>", "\n## User · x\n", "```"]),
        lambda: "a\x00b",
        lambda: "x\ud800y",
        lambda: "汉" * rng.randint(1, 300),
        lambda: "x" * rng.choice([0, 1, 255, 256, 5000]),
        lambda: rng.choice([True, False, None]),
        lambda: rng.random(),
    ]
    if depth < 3:
        choices += [
            lambda: [hostile_value(rng, ids, depth + 1) for _ in range(rng.randint(0, 3))],
            lambda: {
                rng.choice(KEYS): hostile_value(rng, ids, depth + 1)
                for _ in range(rng.randint(0, 4))
            },
        ]
    return rng.choice(choices)()


KEYS = [
    "session_id", "message_id", "content", "client_id", "title", "name", "system_prompt",
    "model", "config_json", "context", "tools", "instructions", "before", "after", "limit",
    "cursor", "q", "username", "password", "text", "date", "unknown_key", "type",
]  # fmt: skip


# The fields each route takes, by the end of its path: a body made only of others is refused
# as a whole (an unknown field) before any value in it is looked at, so most bodies keep to
# these and reach the fields' own checks and the services.
ROUTE_KEYS = {
    "/send": ["session_id", "content", "client_id"],
    "/regenerate": ["session_id", "message_id"],
    "/truncate": ["session_id", "message_id"],
    "/compact": ["instructions"],
    "/sessions": ["title", "agent_id"],
    "/sessions/<session_id>": ["title", "model"],
    "/agents": ["name", "system_prompt", "model", "config_json"],
    "/agents/<agent_id>": ["name", "system_prompt", "model", "config_json"],
    "/entries": ["content", "source_message_id", "tags"],
    "/entries/<name>": ["content", "tags"],
    "/auth/token": ["username", "password"],
}


def route_keys(template: str) -> list[str]:
    """The keys a hostile body for `template` is made of: the route's own most of the time,
    any (an unknown one included) else."""
    for end, keys in ROUTE_KEYS.items():
        if re.sub(r"<(?:\w+:)?(\w+)>", r"<\1>", template).endswith(end):
            return keys
    return KEYS


def hostile_body(rng: random.Random, ids: list[int], keys: list[str] | None = None) -> str:
    kind = rng.random()
    if kind < 0.1:
        return "[" * 5000 + "]" * 5000
    if kind < 0.2:
        return rng.choice(["", "{", "not json", '{"a": 1,}', "\ufeff{}", '"just a string"'])
    pool = keys if keys is not None and rng.random() < 0.85 else KEYS
    body = {rng.choice(pool): hostile_value(rng, ids) for _ in range(rng.randint(0, 6))}
    text = json.dumps(body, ensure_ascii=True)
    return text.replace("\\u0000", "\\u0000")  # NUL and surrogates stay JSON escapes


def fill(template: str, rng: random.Random, ids: list[int]) -> str:
    def one(match: re.Match[str]) -> str:
        return str(rng.choice([*ids, *ids, 0, -1, "%202", "%D9%A2", "abc", "9" * 30, "a%2Fb"]))

    return _PARAM.sub(one, template)


def _assert_answer(response: Any, where: str) -> None:
    assert response.status_code < 500, (where, response.status_code, response.content[:300])
    # Every 4xx, the documentation routes' too (cadau/apidocs.py), in the JSON error shape.
    if 400 <= response.status_code < 500:
        assert response["Content-Type"].startswith("application/json"), where
        body = response.json()
        assert isinstance(body.get("error"), dict) and body["error"].get("code"), (where, body)


def _outsider_state() -> list[Any]:
    return [
        list(ChatSession.objects.filter(owner__username="outsider").values().order_by("id")),
        list(
            ChatMessage.objects.filter(session__owner__username="outsider").values().order_by("id")
        ),
        list(Agent.objects.filter(owner__username="outsider").values().order_by("id")),
    ]


def test_the_resolver_finds_the_api():
    routes = api_routes()
    assert "/api/v1/chat/send" in routes and "/api/v1/auth/token" in routes
    assert any("<" in r for r in routes)  # routes that take ids are among them
    assert len(routes) >= 15


def test_every_route_and_method_answers_hostile_input_with_a_4xx(
    api, owner, outsider, fake_llm, settings
):
    # One user's hundreds of requests in a second: past the per-user allowances every write
    # would be a 429 before its view, and the views' own handling would go untested.
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "api_read": "off", "api_write": "off"}
    mine = ChatSessionFactory(owner=owner)
    make_conversation(mine, turns=2)
    theirs = ChatSessionFactory(owner=outsider)
    make_conversation(theirs, turns=2)
    my_agent, their_agent = AgentFactory(owner=owner), AgentFactory(owner=outsider)
    ids = sorted(
        {mine.pk, theirs.pk, my_agent.pk, their_agent.pk}
        | set(ChatMessage.objects.values_list("id", flat=True))
    )
    before = _outsider_state()
    rng = random.Random(SEED)
    for template in api_routes():
        for case in range(CASES_PER_ROUTE):
            path = fill(template, rng, ids)
            method = rng.choice(["get", "post", "patch", "put", "delete"])
            where = f"{method.upper()} {path} (seed {SEED}, case {case})"
            if method == "get":
                # Percent-encoded by hand: a hostile client sends bytes no encoder would make
                # (a surrogate's UTF-8 form, NUL).
                query = "&".join(
                    f"{rng.choice(KEYS)}="
                    + quote(str(hostile_value(rng, ids))[:300].encode("utf-8", "surrogatepass"))
                    # Bytes that are not UTF-8 at all (issue 26): a 400, never U+FFFD.
                    + rng.choice(["", "", "", "%FF", "%C3", "%ED%A0%80"])
                    for _ in range(3)
                )
                response = api.get(f"{path}?{query}")
            else:
                body = hostile_body(rng, ids, route_keys(template))
                response = getattr(api, method)(path, data=body, content_type="application/json")
            _assert_answer(response, where)
    assert _outsider_state() == before


FRAMES = ["send", "cancel", "unknown", None]


async def test_every_frame_type_answers_hostile_fields_and_the_socket_survives(owner, fake_llm):
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    rng = random.Random(SEED)
    ws = await _ws(session.pk, owner)
    assert (await ws.connect(timeout=5))[0]
    for case in range(40):
        kind = rng.choice(FRAMES)
        # Mostly the keys the frame's type takes (a send's content and client_id): a frame with
        # another key is refused before its values are looked at.
        pool = KEYS if rng.random() < 0.2 else ["content", "client_id"]
        frame: dict[str, Any] = {rng.choice(pool): hostile_value(rng, [session.pk]) for _ in "ab"}
        if kind is not None:
            frame["type"] = kind
        if kind == "send" and rng.random() < 0.5:
            frame["content"] = hostile_value(rng, [session.pk])
        await ws.send_to(text_data=json.dumps(frame))
        # Every frame is answered (an error, or a send's events), then the socket is quiet
        # and still open. (A send's reply may end with an error and then `done`.)
        try:
            answers = [await ws.receive_json_from(timeout=10)]
        except TimeoutError:
            raise AssertionError(f"frame {case} was not answered: {frame!r}") from None
        while not await ws.receive_nothing(timeout=0.3):
            answers.append(await ws.receive_json_from(timeout=10))
        kinds = {a["type"] for a in answers}
        assert kinds <= {"error", "message", "delta", "done", "compaction"}, (case, frame, kinds)
    output = await ws.receive_output(timeout=0.2) if not await ws.receive_nothing(0.2) else None
    assert output is None or output.get("code") != 1011
    await ws.disconnect()


# --- issue 26: strict types, the export, prompts, query text -------------------------------------

WRONG_INTEGERS = [
    "١٢",
    "１２",
    " 1",
    "1 ",
    "1.0",
    "+1",
    "1_0",
    "1e0",
    1.0,
    1.5,
    True,
    None,
    [1],
    {},
]
WRONG_STRINGS = [12, 0, 1.5, True, False, [], ["a"], {"a": "b"}]


def test_wrong_types_on_chat_routes_store_nothing_and_call_no_model(api, owner, fake_llm):
    """Every id, count and string field of the chat routes' bodies, each given values of the
    wrong type: a 400 `invalid`, no row added or changed, no model call."""
    session = ChatSessionFactory(owner=owner, title="kept")
    make_conversation(session, turns=1)
    last = ChatMessage.objects.filter(session=session).order_by("-id").first()
    assert last is not None
    valid = {"session_id": session.pk, "message_id": last.pk}
    sessions = f"/api/v1/chat/sessions/{session.pk}"
    ids, send = ["session_id", "message_id"], {**valid, "content": "hi", "client_id": "c"}
    routes: list[tuple[str, str, dict[str, Any], list[str], list[str]]] = [
        ("post", "/api/v1/chat/send", send, ["session_id"], ["content", "client_id"]),
        ("post", "/api/v1/chat/regenerate", valid, ids, []),
        ("post", "/api/v1/chat/truncate", valid, ids, []),
        ("post", "/api/v1/chat/sessions", {"title": "t"}, ["agent_id"], ["title"]),
        ("patch", sessions, {"title": "t"}, [], ["title"]),
        ("post", f"{sessions}/compact", {"instructions": "x"}, [], ["instructions"]),
    ]
    before = (
        list(ChatMessage.objects.values().order_by("id")),
        list(ChatSession.objects.values("id", "title").order_by("id")),
    )
    rng = random.Random(SEED)
    for method, path, body, int_fields, str_fields in routes:
        cases = [(f, v) for f in int_fields for v in WRONG_INTEGERS]
        cases += [(f, v) for f in str_fields for v in WRONG_STRINGS]
        for field, value in rng.sample(cases, min(len(cases), 12)):
            if value is None and field == "agent_id":
                continue  # a session without an agent: null is its documented value
            response = getattr(api, method)(path, {**body, field: value}, format="json")
            where = f"{method.upper()} {path} {field}={value!r}"
            assert response.status_code == 400, (where, response.content[:300])
            assert response.json()["error"]["code"] == "invalid", where
    after = (
        list(ChatMessage.objects.values().order_by("id")),
        list(ChatSession.objects.values("id", "title").order_by("id")),
    )
    assert after == before and fake_llm.count() == 0


MARKDOWN_PIECES = [
    "## User", "# x", "User", "---", "===", "```", "~~~", "````", "<h2>", "</h2>", "<!--",
    "-->", "> ", "- ", "1. ", "    ", "   ", " ", "\n", "\n\n", "`", "#", "text", "py",
]  # fmt: skip


@hsettings(max_examples=600, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(MARKDOWN_PIECES) | st.text(max_size=5), max_size=12).map("".join),
        min_size=1,
        max_size=4,
    ),
    st.text(max_size=20),
)
def test_no_message_text_or_tool_name_adds_or_hides_an_export_heading(contents, tool_name):
    from datetime import UTC, datetime

    from markdown_it import MarkdownIt

    from chat.api.export import _markdown_head, _markdown_message
    from chat.models import MessageRole

    when = datetime(2026, 12, 5, tzinfo=UTC)
    session = ChatSession(pk=1, title="t", created_at=when)
    messages = [
        ChatMessage(role=MessageRole.USER, content=text, created_at=when) for text in contents
    ]
    messages.append(
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="",
            created_at=when,
            tool_calls=[{"function": {"name": tool_name, "arguments": contents[0]}}],
        )
    )
    markdown = _markdown_head(session, when) + "".join(_markdown_message(m) for m in messages)
    html = MarkdownIt("commonmark", {"html": True}).render(markdown)
    assert re.findall(r"<h([1-6])>", html) == ["1"] + ["2"] * len(messages), markdown


SPECIAL_PIECES = ["<", "|", "｜", ">", "[", "]", "/", "im_start", "INST", "s", "SYS", "eot_id"]


@hsettings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(SPECIAL_PIECES) | st.text(max_size=3), max_size=30).map("".join))
def test_no_composition_of_marker_pieces_reaches_the_model_as_a_marker(text):
    from chat.llm.special import ZWJ, text_neutralised

    out = text_neutralised(text)
    assert out.replace(ZWJ, "") == text.replace(ZWJ, "")
    for marker in ("<|im_start|>", "[INST]", "[/INST]", "</s>", "<s>", "<<SYS>>", "<|eot_id|>"):
        assert marker not in out


@hsettings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_query_strings_are_utf8_exactly_when_their_bytes_are(raw):
    from cadau.querytext import query_string_is_utf8

    try:
        raw.decode("utf-8")
        expected = True
    except UnicodeDecodeError:
        expected = False
    assert query_string_is_utf8(b"q=" + quote(raw).encode()) is expected


@hsettings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=25), st.integers(), st.floats(), st.booleans(), st.none()))
def test_an_id_is_read_only_from_what_prints_as_it(value):
    from chat.text import ascii_int

    parsed = ascii_int(value)
    if parsed is not None:
        assert not isinstance(value, (bool, float))
        assert isinstance(value, int) or re.fullmatch(r"-?[0-9]+", value)
