"""Child process of `python -m bench realmodel`: long English and Chinese sends through the real
send path to the real model server the parent started, then one JSON line of what happened.

    python -m bench.realmodel_worker --sends 10
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

ENGLISH = (
    "Here is a long note about my garden. The tomatoes are planted along the south fence, the "
    "beans climb the old ladder, and the herbs grow in three pots near the kitchen door. "
)
CHINESE = "我的花园里有番茄、豆子和香草。番茄种在南边的篱笆旁，豆子爬在旧梯子上。"


def _content(*, language: str, i: int) -> str:
    english = ENGLISH * 4 + f"Question {i}: what grows by the fence?"
    chinese = CHINESE * 3 + f"问题 {i}：篱笆旁种了什么？"
    if language == "en":
        return english
    if language == "zh":
        return chinese
    # "mixed" (issue 25's eight sends): English, Chinese, both in one turn, long Chinese, so
    # the token estimate learned from one script meets the other.
    return (
        english,
        chinese,
        ENGLISH * 2 + CHINESE + f" Question {i}: 番茄种在哪里？",
        CHINESE * 6 + f"问题 {i}：豆子爬在哪里？",
    )[i % 4]


def _conversation(*, owner: Any, language: str, sends: int) -> dict[str, Any]:
    from asgiref.sync import async_to_sync

    from chat.models import ChatMessage, ChatSession, MessageRole
    from chat.turn import turn_open

    session = ChatSession.objects.create(owner=owner, title=language)
    replies = []
    for i in range(sends):
        content = _content(language=language, i=i)
        started = time.monotonic()
        run = async_to_sync(turn_open)(
            user=owner, session_id=session.pk, content=content, client_id=None
        )
        result = async_to_sync(run.result)()
        reply = ChatMessage.objects.get(pk=(result.assistant_message or {})["id"])
        metadata = reply.metadata or {}
        usage = metadata.get("usage") or {}
        replies.append(
            {
                "ok": reply.status == "complete" and bool(reply.content.strip()),
                "status": reply.status,
                "error_code": metadata.get("error_code"),
                "cut": metadata.get("cut"),
                "waited": metadata.get("summary_calls_waited", 0),
                "payload_runes": metadata.get("payload_runes"),
                "prompt_tokens": usage.get("prompt_tokens"),
                "seconds": round(time.monotonic() - started, 2),
            }
        )
    stored = ChatMessage.objects.filter(session=session, role=MessageRole.USER).count()
    return {"session_id": session.pk, "replies": replies, "stored_user_messages": stored}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from chat.llm import get_provider, window
    from chat.models import ContextSnapshot
    from devtools.introspect import background_wait, tokens_factors

    call_command("migrate", verbosity=0, interactive=False)
    owner = get_user_model().objects.create_user(username="bench", password="bench-pw-1")
    results = {
        lang: _conversation(owner=owner, language=lang, sends=args.sends)
        for lang in ("en", "zh", "mixed")
    }
    background_wait(timeout=600)
    snapshots = list(
        ContextSnapshot.objects.values("session_id", "outcome", "model", "trigger", "error")
    )
    model = get_provider().model
    print(
        json.dumps(
            {
                "conversations": results,
                "snapshots": snapshots,
                "window_learned": window.window_learned_get(model=model),
                "tokens_factors": tokens_factors(model=model),
            }
        )
    )


if __name__ == "__main__":
    main()
