"""One conversation through one running Cadau server, over its HTTP API only, for
`python -m bench fidelity`: replay every exchange as a send (the fake model scripted with the
reply just before it), then ask each question as a send, read the payload the model received
from the fake server's recorded calls, score it, and take the question back (truncate: the
API's edit-and-resend), so every question is asked of the same replayed conversation.

Between sends the driver waits for the server's background jobs (`bench/background-idle`,
bench.urls): a person takes a moment to type, long enough for a background compaction."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.fidelity_data import (
    Conversation,
    Question,
    evidence_present,
    message_content,
    payload_haystack,
    question_covered,
)

QUESTION_REPLY = "Let me think about that."
USERNAME = "fidelity"
PASSWORD = "fidelity-bench-password"


@dataclass(slots=True)
class Outcome:
    """What one conversation under one configuration measured."""

    exchanges: int = 0
    #: Sends (replay and questions) that did not end with the scripted reply stored complete.
    failed_sends: list[str] = field(default_factory=list)
    replay_summary_calls: int = 0
    question_summary_calls: int = 0
    #: Runes of every chat payload (replay and questions) over the budget.
    over_budget: int = 0
    max_payload_runes: int = 0
    #: Per question: (category, all evidence present, payload runes).
    questions: list[tuple[int, bool, int]] = field(default_factory=list)
    #: The questions not covered: text, category and the evidence turns missing from the
    #: payload (what a change to recall or the summary should look at first).
    missed: list[dict[str, Any]] = field(default_factory=list)
    summaries_rewound: int = 0
    replay_seconds: float = 0.0
    question_seconds: float = 0.0


class Driver:
    """The HTTP clients of one run: the app (as the bench user) and the fake model server."""

    def __init__(self, *, app_url: str, fake_url: str, budget: int) -> None:
        self.fake = httpx.Client(base_url=fake_url, timeout=60)
        self.app = httpx.Client(base_url=app_url, timeout=300)
        token = self.app.post(
            "/api/v1/auth/token", json={"username": USERNAME, "password": PASSWORD}
        )
        token.raise_for_status()
        self.app.headers["Authorization"] = f"Token {token.json()['token']}"
        self.budget = budget

    def close(self) -> None:
        self.app.close()
        self.fake.close()

    def calls(self, *, since: int, bodies: bool) -> dict[str, Any]:
        answer = self.fake.get(
            "/_control/calls", params={"since": since, "bodies": "1" if bodies else "0"}
        )
        answer.raise_for_status()
        data: dict[str, Any] = answer.json()
        return data

    def calls_total(self) -> int:
        return int(self.calls(since=1 << 40, bodies=False)["total"])

    def idle(self) -> None:
        self.app.get("/bench/background-idle", params={"timeout": 300}).raise_for_status()

    def send(self, *, session_id: int, content: str, reply: str) -> tuple[int | None, str]:
        """Script `reply`, send `content`; (the stored user message's id, "" or what failed)."""
        self.fake.post(
            "/_control/script", json={"replies": [reply], "target": "chat", "replace": True}
        ).raise_for_status()
        answer = self.app.post(
            "/api/v1/chat/send", json={"session_id": session_id, "content": content}
        )
        if answer.status_code != 200:
            return None, f"HTTP {answer.status_code}: {answer.text[:200]}"
        data = answer.json()
        message = data.get("assistant_message") or {}
        user_id = (data.get("user_message") or {}).get("id")
        if message.get("status") != "complete":
            return user_id, f"reply {message.get('status')}: {message.get('metadata')}"
        if message.get("content") != reply:
            return user_id, "the stored reply is not the scripted one"
        return user_id, ""


def _account(outcome: Outcome, calls: list[dict[str, Any]], *, budget: int) -> None:
    for call in calls:
        if call["kind"] == "chat":
            runes = int(call["prompt_runes"])
            outcome.max_payload_runes = max(outcome.max_payload_runes, runes)
            outcome.over_budget += runes > budget


def _replay(driver: Driver, outcome: Outcome, *, session_id: int, conv: Conversation) -> None:
    started, mark = time.perf_counter(), driver.calls_total()
    for n, exchange in enumerate(conv.exchanges):
        _id, failure = driver.send(
            session_id=session_id, content=exchange.user, reply=exchange.reply
        )
        if failure:
            outcome.failed_sends.append(f"replay {n} ({exchange.dia_ids[0]}): {failure}")
        driver.idle()
    outcome.exchanges = len(conv.exchanges)
    recorded = driver.calls(since=mark, bodies=False)["calls"]
    _account(outcome, recorded, budget=driver.budget)
    outcome.replay_summary_calls = sum(1 for c in recorded if c["kind"] == "summary")
    outcome.replay_seconds = time.perf_counter() - started


def _ask(
    driver: Driver, outcome: Outcome, *, session_id: int, conv: Conversation, question: Question
) -> None:
    mark = driver.calls_total()
    user_id, failure = driver.send(
        session_id=session_id, content=question.question, reply=QUESTION_REPLY
    )
    driver.idle()
    recorded = driver.calls(since=mark, bodies=True)["calls"]
    _account(outcome, recorded, budget=driver.budget)
    outcome.question_summary_calls += sum(1 for c in recorded if c["kind"] == "summary")
    asked = [c for c in recorded if c["kind"] == "chat" and question.question in _last_user(c)]
    if failure or not asked:
        outcome.failed_sends.append(f"question {question.question!r}: {failure or 'no call'}")
        outcome.questions.append((question.category, False, 0))
    else:
        call = asked[-1]
        haystack = payload_haystack(call["body"]["messages"], question=question.question)
        covered = question_covered(haystack=haystack, question=question, turns=conv.turns)
        outcome.questions.append((question.category, covered, int(call["prompt_runes"])))
        if not covered:
            missing = [
                dia_id
                for dia_id in question.evidence
                if not evidence_present(haystack=haystack, text=conv.turns[dia_id].text)
            ]
            outcome.missed.append(
                {"question": question.question, "category": question.category, "missing": missing}
            )
    if user_id is not None:
        cut = driver.app.post(
            "/api/v1/chat/truncate", json={"session_id": session_id, "message_id": user_id}
        )
        cut.raise_for_status()
        outcome.summaries_rewound += bool(cut.json().get("summary_rewound"))


def _last_user(call: dict[str, Any]) -> str:
    for message in reversed(call["body"].get("messages") or []):
        if message.get("role") == "user":
            return message_content(message)
    return ""


def conversation_run(*, app_url: str, fake_url: str, conv: Conversation, budget: int) -> Outcome:
    """Replay `conv` in a new session of the bench user, then ask its questions."""
    driver = Driver(app_url=app_url, fake_url=fake_url, budget=budget)
    try:
        created = driver.app.post("/api/v1/chat/sessions", json={"title": f"LoCoMo {conv.name}"})
        created.raise_for_status()
        session_id = int(created.json()["id"])
        outcome = Outcome()
        _replay(driver, outcome, session_id=session_id, conv=conv)
        started = time.perf_counter()
        for question in conv.questions:
            _ask(driver, outcome, session_id=session_id, conv=conv, question=question)
        outcome.question_seconds = time.perf_counter() - started
        return outcome
    finally:
        driver.close()
