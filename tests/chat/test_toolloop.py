"""RunAgentToolLoop against the fake LLM server scripting tool calls: stored messages in order,
events, the round limit, tool errors, path traversal through tools, and checkpoints of earlier
round trips when the loop's context nears the budget."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from agentmemory import store
from chat import tools
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.tools import Tool, tool_register
from chat.turn.checkpoint import CHECKPOINT_PREFIX
from tests.factories import AgentFactory, ChatSessionFactory
from tests.helpers import send_streaming

pytestmark = pytest.mark.django_db(transaction=True)


def tool_unregister(name: str) -> None:
    """Take back a tool a test registered: the registry lives as long as the process."""
    with tools._lock:
        tools._registry.pop(name, None)


@pytest.fixture(autouse=True)
def runtime(settings, tmp_path: Path) -> Path:
    root = tmp_path / "runtime"
    root.mkdir()
    settings.RUNTIME_DIR = root
    settings.AGENT_MEMORY_STORAGE = ""
    return root


def _agent_session(owner, **config):
    agent = AgentFactory(owner=owner, config_json=config)
    return agent, ChatSessionFactory(owner=owner, agent=agent)


def _send(api, session, content="go"):
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def _call(name, arguments, call_id=None):
    call = {"name": name, "arguments": arguments}
    if call_id:
        call["id"] = call_id
    return call


def _rows(session):
    return list(ChatMessage.objects.filter(session=session).order_by("id"))


def test_rounds_store_messages_in_order_and_feed_results_back(api, owner, fake_llm, runtime):
    agent, session = _agent_session(owner)
    fake_llm.script(
        {
            "content": "Let me write it down.",
            "tool_calls": [
                _call("workspace_write", {"path": "notes/plan.md", "content": "step one"}, "c1")
            ],
        },
        {"tool_calls": [_call("workspace_read", {"path": "notes/plan.md"}, "c2")]},
        "The plan says: step one",
    )
    body = _send(api, session, "write and read my plan")
    rows = _rows(session)
    assert [(r.role, bool(r.tool_calls)) for r in rows] == [
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]
    user, first, result1, second, result2, final = rows
    assert all(r.status == MessageStatus.COMPLETE for r in rows)
    assert first.content == "Let me write it down."
    assert first.tool_calls[0]["function"]["name"] == "workspace_write"
    assert result1.tool_call_id == "c1" and result1.content.startswith("Wrote 8 characters")
    assert result2.tool_call_id == "c2" and result2.content == "step one"
    assert final.content == "The plan says: step one"
    assert body["assistant_message"]["id"] == final.pk
    assert final.metadata["reply_to"] == user.pk and second.metadata["reply_to"] == user.pk
    assert final.metadata["rounds"] == 3
    session.refresh_from_db()
    assert session.message_count == 6
    # the file really is in the agent's workspace
    folder = runtime / str(agent.memory_uuid)
    assert (folder / "workspace" / "notes" / "plan.md").read_text() == "step one"
    # every call offered the tools; the second and third saw the earlier results in full
    chat_calls = [c for c in fake_llm.calls if c.kind == "chat"]
    assert len(chat_calls) == 3
    names = {t["function"]["name"] for t in chat_calls[0].body["tools"]}
    assert {"memory_write", "memory_search", "workspace_read", "current_time"} <= names
    third = chat_calls[2].body["messages"]
    assert [m["role"] for m in third[-4:]] == ["assistant", "tool", "assistant", "tool"]
    assert {"role": "tool", "tool_call_id": "c2", "content": "step one"} in third
    assert third[-1] == {"role": "tool", "tool_call_id": "c2", "content": "step one"}


def test_events_announce_calls_and_results(api, owner, fake_llm):
    _agent, session = _agent_session(owner)
    fake_llm.script({"tool_calls": [_call("current_time", {}, "t1")]}, "It is now.")
    events = send_streaming(api, session, "what time is it?")
    types = [e["type"] for e in events]
    assert types.index("tool_call") < types.index("tool_result") < types.index("done")
    call = next(e for e in events if e["type"] == "tool_call")
    result = next(e for e in events if e["type"] == "tool_result")
    assert call["message"]["tool_calls"][0]["id"] == "t1"
    assert result["message"]["role"] == "tool" and result["message"]["tool_call_id"] == "t1"
    assert result["tool"] == "current_time" and result["is_error"] is False
    assert "utc" in json.loads(result["message"]["content"])
    done = events[-1]
    assert done["message"]["content"] == "It is now."
    # deltas of the final round name the final row
    final_deltas = {e["message_id"] for e in events if e["type"] == "delta"}
    assert final_deltas == {done["message"]["id"]}


def test_round_limit_then_one_answer_without_tools(api, owner, fake_llm, caplog):
    _agent, session = _agent_session(owner, max_tool_rounds=2)
    looping = {"tool_calls": [_call("current_time", {})]}
    fake_llm.script(
        looping, looping, {"content": "Enough tools.", "tool_calls": [_call("current_time", {})]}
    )
    with caplog.at_level(logging.WARNING, logger="chat.toolloop"):
        body = _send(api, session)
    chat_calls = [c for c in fake_llm.calls if c.kind == "chat"]
    assert len(chat_calls) == 3
    assert "tools" in chat_calls[0].body and "tools" in chat_calls[1].body
    assert "tools" not in chat_calls[2].body
    assert body["assistant_message"]["content"] == "Enough tools."
    roles = [r.role for r in _rows(session)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "chat_agent_tool_round_limit" in caplog.text


def test_tool_errors_become_results_and_the_loop_goes_on(api, owner, fake_llm):
    def broken(context, arguments):
        raise RuntimeError("disk on fire")

    tool = tool_register(Tool(name="broken_tool", description="x", handler=broken))
    try:
        _agent, session = _agent_session(
            owner, tools=["broken_tool", "memory_read", "workspace_read"]
        )
        fake_llm.script(
            {
                "tool_calls": [
                    _call("broken_tool", {}, "a"),
                    _call("not_a_tool", {}, "b"),
                    {"name": "workspace_read", "arguments": "{not json", "id": "c"},
                    _call("memory_read", {"name": "missing-entry"}, "d"),
                    _call("workspace_read", {}, "e"),
                ]
            },
            "Sorry, the tools failed.",
        )
        body = _send(api, session)
    finally:
        tool_unregister(tool.name)
    results = {r.tool_call_id: r.content for r in _rows(session) if r.role == MessageRole.TOOL}
    assert results["a"] == "Error: RuntimeError: disk on fire"
    assert results["b"].startswith("Error: there is no tool named 'not_a_tool'")
    assert "not valid JSON" in results["c"]
    assert results["d"].startswith("Error: not found")
    assert results["e"] == "Error: missing argument 'path'"
    assert body["assistant_message"]["content"] == "Sorry, the tools failed."
    assert body["assistant_message"]["status"] == "complete"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("workspace_read", {"path": "../../../etc/passwd"}),
        ("workspace_read", {"path": "/etc/passwd"}),
        ("workspace_read", {"path": "..%2F..%2Fsecret"}),
        ("workspace_write", {"path": "../memory/entries/evil.md", "content": "x"}),
        ("workspace_write", {"path": "a/../../../escape.txt", "content": "x"}),
        ("memory_read", {"name": "../../workspace/x"}),
        ("memory_write", {"name": "../evil", "content": "x"}),
    ],
)
def test_path_traversal_through_tools_is_refused(api, owner, fake_llm, runtime, tool, arguments):
    _agent, session = _agent_session(owner)
    fake_llm.script({"tool_calls": [_call(tool, arguments, "p")]}, "ok")
    _send(api, session)
    result = next(r for r in _rows(session) if r.role == MessageRole.TOOL)
    assert result.content.startswith("Error: refused: unsafe name"), result.content
    written = {p.relative_to(runtime).as_posix() for p in runtime.rglob("*") if p.is_file()}
    assert not any("evil" in p or "escape" in p for p in written)
    assert not (runtime.parent / "escape.txt").exists()


def test_memory_write_tool_stores_an_entry_with_its_source(api, owner, fake_llm):
    agent, session = _agent_session(owner)
    fake_llm.script(
        {
            "tool_calls": [
                _call("memory_write", {"content": "User's cat is Miso.", "tags": ["pets"]})
            ]
        },
        "Noted.",
    )
    _send(api, session, "my cat is Miso")
    [entry] = store.entry_list(agent_id=agent.pk)
    assert entry.content == "User's cat is Miso."
    assert set(entry.tags) == {"pets", "agent"}
    user = ChatMessage.objects.get(session=session, role=MessageRole.USER)
    assert (entry.source_session_id, entry.source_message_id) == (session.pk, user.pk)


def test_sessions_without_agent_or_tools_get_no_tools(api, owner, fake_llm):
    plain = ChatSessionFactory(owner=owner)
    _send(api, plain)
    assert "tools" not in fake_llm.calls[-1].body
    _agent, no_tools = _agent_session(owner, tools=[])
    _send(api, no_tools)
    assert "tools" not in fake_llm.calls[-1].body
    _agent, some = _agent_session(owner, tools=["current_time"])
    _send(api, some)
    assert [t["function"]["name"] for t in fake_llm.calls[-1].body["tools"]] == ["current_time"]


def _big_tool(size: int) -> Tool:
    def handler(context, arguments):
        return f"[{arguments.get('n')}]" + "x" * size

    return Tool(
        name="big_lookup",
        description="returns a lot",
        handler=handler,
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )


@pytest.fixture
def big_tool():
    tool = tool_register(_big_tool(700), replace=True)
    yield tool
    tool_unregister(tool.name)


def _loop_config(**extra):
    return {
        "tools": ["big_lookup"],
        "context": {"input_budget_runes": 2000, "target_pct": 40, "summary_max_runes": 300},
        **extra,
    }


def test_checkpoint_replaces_earlier_round_trips_near_the_budget(
    api, owner, fake_llm, big_tool, caplog
):
    _agent, session = _agent_session(owner, **_loop_config())
    fake_llm.script(*[{"tool_calls": [_call("big_lookup", {"n": n}, f"k{n}")]} for n in range(4)])
    fake_llm.script("All four looked up.")
    fake_llm.script_summary("CKPT-A: looked up 0 and 1", "CKPT-B: looked up 0, 1 and 2")
    with caplog.at_level(logging.INFO, logger="chat.toolloop"):
        body = _send(api, session, "look up four things")
    assert body["assistant_message"]["content"] == "All four looked up."
    assert "chat_agent_context_compact_llm " in caplog.text
    assert fake_llm.count("summary") >= 1
    last = [c for c in fake_llm.calls if c.kind == "chat"][-1].body["messages"]
    checkpoints = [m for m in last if str(m.get("content", "")).startswith(CHECKPOINT_PREFIX)]
    assert len(checkpoints) == 1 and "CKPT-" in checkpoints[0]["content"]
    tool_ids = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert tool_ids[-1] == "k3"  # the latest round stays verbatim
    assert "k0" not in tool_ids  # earlier ones are in the checkpoint
    assert sum(len(str(m.get("content") or "")) for m in last) <= 2000 * 88 // 100 + 1000
    # the checkpoint call summarised this turn's round trips, not the session
    summary_call = next(c for c in fake_llm.calls if c.kind == "summary")
    assert "look up four things" in summary_call.body["messages"][1]["content"]
    # stored messages are untouched: every result is there in full
    stored = [r for r in _rows(session) if r.role == MessageRole.TOOL]
    assert [r.tool_call_id for r in stored] == ["k0", "k1", "k2", "k3"]
    assert all(len(r.content) > 700 for r in stored)


def test_failed_checkpoint_drops_oldest_rounds_for_that_call_only(
    api, owner, fake_llm, big_tool, caplog
):
    _agent, session = _agent_session(owner, **_loop_config())
    fake_llm.script(*[{"tool_calls": [_call("big_lookup", {"n": n}, f"k{n}")]} for n in range(3)])
    fake_llm.script("Done anyway.")
    fake_llm.fail_next("500", target="summary", times=50)
    with caplog.at_level(logging.INFO, logger="chat.toolloop"):
        body = _send(api, session)
    assert body["assistant_message"]["content"] == "Done anyway."
    assert "chat_agent_context_compact_llm_failed" in caplog.text
    last = [c for c in fake_llm.calls if c.kind == "chat"][-1].body["messages"]
    assert any("left out: context budget" in str(m.get("content")) for m in last)
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"][-1] == "k2"
    assert len([r for r in _rows(session) if r.role == MessageRole.TOOL]) == 3


def test_single_huge_round_is_skipped_not_compacted(api, owner, fake_llm, caplog):
    tool = tool_register(_big_tool(3000), replace=True)
    try:
        _agent, session = _agent_session(owner, **_loop_config())
        fake_llm.script({"tool_calls": [_call("big_lookup", {"n": 1})]}, "ok")
        with caplog.at_level(logging.INFO, logger="chat.toolloop"):
            _send(api, session)
    finally:
        tool_unregister(tool.name)
    assert "chat_agent_context_compact_skipped" in caplog.text
    assert fake_llm.count("summary") == 0


def _echo(context, arguments):
    return f"echo {arguments.get('text', '')} for agent {context.agent_id}"


DEPLOYMENT_TOOL = Tool(
    name="deploy_echo",
    description="A deployment's own tool, registered through settings.AGENT_TOOLS.",
    handler=_echo,
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)


def test_deployment_tools_from_settings_are_opt_in(api, owner, fake_llm, settings):
    settings.AGENT_TOOLS = ["tests.chat.test_toolloop.DEPLOYMENT_TOOL"]
    try:
        r = api.post(
            "/api/v1/agents",
            {"name": "ops", "config_json": {"tools": ["deploy_echo"]}},
            format="json",
        )
        assert r.status_code == 201, r.content
        agent_id = r.json()["id"]
        session = ChatSessionFactory(owner=owner, agent_id=agent_id)
        fake_llm.script({"tool_calls": [_call("deploy_echo", {"text": "hi"}, "d1")]}, "done")
        _send(api, session)
        result = next(r for r in _rows(session) if r.role == MessageRole.TOOL)
        assert result.content == f"echo hi for agent {agent_id}"
        # not among the defaults of an agent without a tools list
        _agent, default = _agent_session(owner)
        _send(api, default)
        names = {t["function"]["name"] for t in fake_llm.calls[-1].body["tools"]}
        assert "deploy_echo" not in names and "current_time" in names
    finally:
        tool_unregister("deploy_echo")


def test_a_huge_tool_result_is_cut_to_its_share_of_the_hard_limit(api, owner, fake_llm):
    # A megabyte file read whole went to the model whole, in every round (a probe: a million
    # runes a call against a 48,000-rune limit).
    from chat.context import context_config_for
    from chat.turn.toolloop import tool_result_cap

    tool = tool_register(Tool(name="huge_tool", description="x", handler=lambda c, a: "y" * 10**6))
    try:
        _agent, session = _agent_session(owner, tools=["huge_tool"])
        fake_llm.script({"tool_calls": [_call("huge_tool", {}, "h")]}, "Read it.")
        body = _send(api, session)
    finally:
        tool_unregister(tool.name)
    cap = tool_result_cap(
        hard_limit_runes=context_config_for(session=session).effective_hard_limit_runes
    )
    assert cap < 50_000
    stored = next(r for r in _rows(session) if r.role == MessageRole.TOOL).content
    assert len(stored) < cap + 100 and "more characters" in stored
    sent = [c for c in fake_llm.calls if c.kind == "chat"][-1].body["messages"]
    assert max(len(m.get("content") or "") for m in sent) < cap + 100
    assert body["assistant_message"]["content"] == "Read it."
