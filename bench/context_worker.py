"""Child process of `python -m bench context`: runs one scripted conversation (or one latency
probe) through the real send path against the fake LLM server, with the settings the parent put
in the environment, and prints one JSON line of results.

    python -m bench.context_worker conversation --turns 500
    python -m bench.context_worker latency --sizes 10,100000 --sends 40
    python -m bench.context_worker imported --sizes 10000 --sends 6
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _question(rng: random.Random, turn: int) -> str:
    topics = ["the invoice parser", "deploy script", "cache keys", "the Q3 report", "retry logic"]
    topic = rng.choice(topics)
    detail = " ".join(
        rng.choice(["please", "check", "again", "why", "numbers", "path"])
        for _ in range(rng.randint(10, 50))
    )
    return f"Turn {turn}: about {topic} at /srv/app/{turn}.py, ticket #{1000 + turn}. {detail}"


def _send(*, session: Any, content: str) -> Any:
    from asgiref.sync import async_to_sync

    from chat.models import ChatMessage
    from chat.turn import turn_open

    run = async_to_sync(turn_open)(
        user=session.owner, session_id=session.pk, content=content, client_id=None
    )
    result = async_to_sync(run.result)()
    return ChatMessage.objects.get(pk=(result.assistant_message or {})["id"])


def conversation(*, turns: int, fake_url: str) -> dict[str, Any]:
    """Drive `turns` user messages; report summarising calls, sends that waited on one, and
    rows read per send. Background compaction is waited for after each reply, as if the user
    took a moment to type (it runs while they do)."""
    import httpx
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from chat.models import ChatSession
    from devtools.introspect import background_wait

    user, _ = get_user_model().objects.get_or_create(username="bench-context")
    session = ChatSession.objects.create(
        owner=user, title=f"context bench {settings.CHAT_CONTEXT.strategy}"
    )
    rng = random.Random(7)
    waited = 0
    rows: list[int] = []
    server_ms: list[float] = []
    for turn in range(turns):
        started = time.perf_counter()
        reply = _send(session=session, content=_question(rng, turn))
        server_ms.append((time.perf_counter() - started) * 1000)
        assert reply.status == "complete", reply.metadata
        rows.append(int(reply.metadata.get("rows_read", 0)))
        if reply.metadata.get("summary_calls_waited"):
            waited += 1
        background_wait(timeout=60)
    calls = httpx.get(f"{fake_url}/_control/calls").json()
    session.refresh_from_db()
    return {
        "strategy": settings.CHAT_CONTEXT.strategy,
        "turns": turns,
        "messages": session.message_count,
        "summary_calls": calls["summary"],
        "chat_calls": calls["chat"],
        "sends_waiting": waited,
        "rows_read_mean": statistics.mean(rows),
        "rows_read_max": max(rows),
        "rows_read_last": rows[-1],
        "summary_runes": len(session.context_summary),
        "send_ms_p50": statistics.median(server_ms),
    }


def latency(*, sizes: list[int], sends: int) -> dict[str, Any]:
    """Server time of a send that triggers no compaction, for sessions of each size: the same
    recent tail, a summary standing for everything before it."""
    from django.contrib.auth import get_user_model

    from chat.management.commands.seed_demo import seed_session
    from chat.models import ChatMessage, ChatSession

    user, _ = get_user_model().objects.get_or_create(username="bench-latency")
    out: dict[str, Any] = {}
    for size in sizes:
        seeded = seed_session(user=user, messages=size, title=f"latency {size}")
        session = ChatSession.objects.get(pk=seeded.session_id)
        tail_from = ChatMessage.objects.filter(session=session, role="user").order_by("-id")[4].pk
        if size > 20:
            ChatSession.objects.filter(pk=session.pk).update(
                context_summary="Summary of the earlier conversation. " * 20,
                verbatim_since_message_id=tail_from,
            )
        session.refresh_from_db()
        timings = []
        for i in range(sends):
            started = time.perf_counter()
            reply = _send(session=session, content=f"probe {i}")
            timings.append((time.perf_counter() - started) * 1000)
            assert not reply.metadata.get("summary_calls_waited"), "latency probe compacted"
        timings.sort()
        out[str(size)] = {
            "p50_ms": statistics.median(timings),
            "p95_ms": timings[int(len(timings) * 0.95) - 1],
            "rows_read": reply.metadata.get("rows_read"),
        }
    return out


def imported(*, size: int, sends: int, fake_url: str) -> dict[str, Any]:
    """An imported (seed_demo-made) session of `size` messages and no summary: `sends` sends,
    each followed by the background compaction it started, as a user would type. Reports the
    summarising calls and the runes they were sent, in all and until the payload is steady (no
    backlog left and a send that started no compaction)."""
    import httpx
    from django.contrib.auth import get_user_model

    from chat.context import context_state_fresh
    from chat.management.commands.seed_demo import seed_session
    from chat.models import ChatSession
    from devtools.introspect import background_wait

    user, _ = get_user_model().objects.get_or_create(username="bench-imported")
    seeded = seed_session(user=user, messages=size, title=f"imported {size}")
    session = ChatSession.objects.get(pk=seeded.session_id)
    per_send: list[int] = []
    runes: list[int] = []
    steady_after: int | None = None
    seen = 0
    for i in range(sends):
        reply = _send(session=session, content=f"What did we decide about item {i}?")
        assert reply.status == "complete", reply.metadata
        background_wait(timeout=600)
        recorded = httpx.get(f"{fake_url}/_control/calls", params={"since": seen, "bodies": 0})
        calls = recorded.json()
        seen = calls["total"]
        summaries = [c for c in calls["calls"] if c["kind"] == "summary"]
        per_send.append(len(summaries))
        runes += [int(c["prompt_runes"]) for c in summaries]
        if (
            steady_after is None
            and not summaries
            and not context_state_fresh(session_id=session.pk).backlog
        ):
            steady_after = i
    total = sum(per_send)
    return {
        "size": size,
        "sends": sends,
        "summary_calls": total,
        "calls_before_steady": sum(per_send[:steady_after]) if steady_after is not None else None,
        "steady_after_sends": steady_after,
        "calls_per_send": per_send,
        "prompt_runes_mean": statistics.mean(runes) if runes else 0,
        "prompt_runes_max": max(runes, default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["conversation", "latency", "imported"])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--sizes", default="10,100000")
    parser.add_argument("--sends", type=int, default=40)
    args = parser.parse_args()
    _setup()
    if args.mode == "conversation":
        result = conversation(turns=args.turns, fake_url=os.environ["FAKE_LLM_URL"])
    elif args.mode == "imported":
        size = int(args.sizes.split(",")[0])
        result = imported(size=size, sends=args.sends, fake_url=os.environ["FAKE_LLM_URL"])
    else:
        result = latency(sizes=[int(s) for s in args.sizes.split(",")], sends=args.sends)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
