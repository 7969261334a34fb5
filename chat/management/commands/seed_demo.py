"""`python manage.py seed_demo --messages N`: one long, realistic-looking session for demos and
for the history benchmark (`python -m bench history` calls `seed_session` below, so the data the
benchmark measures is exactly what this command makes).

Speed matters more than anything else here: a million rows must take minutes, not hours, on
SQLite and PostgreSQL alike. So the text comes from pools of pre-rendered sentences (a few random
picks per message instead of hundreds), rows go in with `bulk_create` in batches, one transaction
per batch, and nothing calls `save()` per row. Everything is drawn from one seeded RNG, so the
same arguments produce the same conversation on every machine.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus

DEFAULT_BATCH = 5000
DEFAULT_SEED = 20240601

# --- Vocabulary -------------------------------------------------------------------------------
# Small and technical on purpose: the conversation should read like someone working with an
# assistant on software, which is what Cadau's users do, and it keeps the generator tiny.

_TECH = [
    "Django", "PostgreSQL", "SQLite", "Redis", "nginx", "Docker", "Kubernetes", "React",
    "TypeScript", "Python", "Rust", "Go", "asyncio", "Celery", "GraphQL", "Terraform", "pandas",
    "NumPy", "systemd", "Git", "WebSockets", "OAuth", "gRPC", "Kafka", "ClickHouse",
]  # fmt: skip
_THINGS = [
    "the migration", "a background job", "the connection pool", "the cache layer", "the API",
    "a unit test", "the Dockerfile", "the CI pipeline", "the query planner", "an index",
    "the websocket consumer", "the login flow", "a cron job", "the config loader",
    "the retry logic", "the rate limiter", "a foreign key", "the search endpoint",
    "the deploy script", "the logging setup", "a memory leak", "the serializer",
    "the pagination", "the message queue", "a race condition", "the build cache",
]  # fmt: skip
_VERBS = [
    "speed up", "debug", "refactor", "test", "deploy", "profile", "secure", "document",
    "migrate", "monitor", "cache", "paginate", "validate", "parallelise", "simplify", "roll back",
]  # fmt: skip
_PROBLEMS = [
    "times out", "returns stale data", "deadlocks under load", "leaks file descriptors",
    "fails only in CI", "is ten times slower in production", "loses messages on restart",
    "crashes with a segfault", "uses 4 GB of RAM", "logs the same error twice",
    "breaks after the upgrade", "hangs on the first request",
]  # fmt: skip
_CONDITIONS = [
    "the table has a few million rows", "two workers run at once", "the network is flaky",
    "I run it inside Docker", "the cache is cold", "the user is not logged in",
    "the payload is larger than 1 MB", "the clock jumps", "I deploy on Friday",
]  # fmt: skip
_OPENERS = [
    "Good question.", "Short answer: yes, but with a caveat.", "This is a common trap.",
    "Let's break it down.", "There are two separate issues here.", "It depends on the workload.",
    "You're close.", "The root cause is usually simpler than it looks.", "Sure.",
]  # fmt: skip
_ADVICE = [
    "measure before you change anything, otherwise you are tuning noise",
    "add an index that matches the WHERE clause and the ORDER BY together",
    "keep the transaction short and do the slow network call outside it",
    "make the operation idempotent so a retry cannot apply it twice",
    "log one line per event with the ids you will need when it goes wrong at 3 a.m.",
    "prefer keyset pagination over OFFSET once tables grow past a few thousand rows",
    "pin the dependency and upgrade deliberately, with the changelog open",
    "write the failing test first, then fix the code until it passes",
    "use a bounded queue so a slow consumer applies back-pressure instead of eating memory",
    "set an explicit timeout on every outbound call",
    "move the configuration into environment variables and validate it at start-up",
    "run EXPLAIN ANALYZE on the real data, not on the empty development database",
    "put the expensive part behind a cache with a short TTL and a clear invalidation rule",
    "split the change into two deploys so the old and new code can run side by side",
    "check the error path as carefully as the happy path",
]  # fmt: skip
_CLAIMS = [
    "{tech} handles this well as long as {thing} stays small",
    "the default settings of {tech} are tuned for development, not for production",
    "{thing} is the usual suspect when something {problem}",
    "most people hit this when {condition}",
    "{tech} will not do this for you automatically",
    "the documentation of {tech} covers it, but the example hides the important detail",
    "{thing} behaves differently once {condition}",
    "this pattern scales linearly, which is fine until {condition}",
]  # fmt: skip
_QUESTIONS = [
    "How do I {verb} {thing} in {tech}?",
    "Why does {thing} {problem} when {condition}?",
    "What's the best way to {verb} {thing}? We use {tech}.",
    "Can you explain the difference between {tech} and {tech2} for {thing}?",
    "I'm trying to {verb} {thing} but it {problem}. Any ideas?",
    "Is it safe to {verb} {thing} while {condition}?",
    "Quick one: should {thing} live in {tech} or in {tech2}?",
    "Thanks! And what if {condition}?",
    "Can you write a minimal example that shows how to {verb} {thing} with {tech}?",
    "Our {thing} {problem}. Where would you start looking?",
]  # fmt: skip
_CODE = [
    (
        "python",
        "def page(qs, *, before_id: int | None, limit: int = 50):\n"
        "    if before_id is not None:\n"
        "        qs = qs.filter(id__lt=before_id)\n"
        "    rows = list(qs.order_by('-id')[: limit + 1])\n"
        "    return rows[:limit][::-1], len(rows) > limit",
    ),
    (
        "sql",
        "CREATE INDEX CONCURRENTLY chat_msg_session_id_idx\n"
        "    ON chat_messages (session_id, id);\n"
        "EXPLAIN ANALYZE SELECT * FROM chat_messages\n"
        " WHERE session_id = 42 AND id < 1000000 ORDER BY id DESC LIMIT 51;",
    ),
    (
        "bash",
        "docker compose logs -f --tail=200 web\n"
        "psql \"$DATABASE_URL\" -c 'SELECT count(*) FROM pg_stat_activity;'",
    ),
    (
        "python",
        "async def fetch(client: httpx.AsyncClient, url: str) -> dict:\n"
        "    for attempt in range(3):\n"
        "        try:\n"
        "            r = await client.get(url, timeout=5.0)\n"
        "            r.raise_for_status()\n"
        "            return r.json()\n"
        "        except httpx.TransportError:\n"
        "            await asyncio.sleep(2 ** attempt)\n"
        "    raise RuntimeError('gave up')",
    ),
    (
        "yaml",
        "services:\n  web:\n    image: cadau:latest\n    environment:\n"
        "      DATABASE_URL: postgres://cadau@db/cadau\n    depends_on: [db]",
    ),
    (
        "typescript",
        "const observer = new IntersectionObserver(([entry]) => {\n"
        "  if (entry.isIntersecting) loadOlder();\n"
        "}, { rootMargin: '400px' });\n"
        "observer.observe(topSentinel);",
    ),
]


@dataclass(frozen=True, kw_only=True)
class SeedResult:
    session_id: int
    created: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.created / self.seconds if self.seconds > 0 else float("inf")


class _Writer:
    """Deterministic text generator. Sentences are rendered once into pools, so producing a
    message costs a handful of RNG calls and one join, which keeps 1M messages well under a
    minute of CPU."""

    def __init__(self, *, rng: random.Random) -> None:
        self.rng = rng
        self.questions = [self._render(rng.choice(_QUESTIONS)) for _ in range(1500)]
        self.sentences = [self._sentence() for _ in range(3000)]

    def _render(self, template: str) -> str:
        r = self.rng
        tech, tech2 = r.sample(_TECH, 2)
        return template.format(
            tech=tech,
            tech2=tech2,
            thing=r.choice(_THINGS),
            verb=r.choice(_VERBS),
            problem=r.choice(_PROBLEMS),
            condition=r.choice(_CONDITIONS),
        )

    def _sentence(self) -> str:
        r = self.rng
        if r.random() < 0.5:
            text = self._render(r.choice(_CLAIMS))
        else:
            text = r.choice(["In practice, ", "My advice: ", "Rule of thumb: ", ""]) + r.choice(
                _ADVICE
            )
        # Capitalise the sentence, but not a name that is lower case by convention ("asyncio").
        if text.split(" ", 1)[0] not in _TECH:
            text = text[0].upper() + text[1:]
        return text + "."

    def question(self, *, turn: int) -> str:
        r = self.rng
        text = r.choice(self.questions)
        roll = r.random()
        if roll < 0.15:
            # Users paste context: a longer message with some of their own notes.
            text += " For context: " + " ".join(r.choices(self.sentences, k=r.randint(1, 3)))
        elif roll < 0.2:
            lang, code = r.choice(_CODE)
            text += f"\n\n```{lang}\n{code}\n```\n\nThis is what I have so far (step {turn})."
        return text

    def answer(self) -> str:
        r = self.rng
        parts = [r.choice(_OPENERS)]
        length = r.random()
        # A long tail: most answers are a paragraph or two, a few are essays.
        paragraphs = 1 if length < 0.45 else 2 if length < 0.8 else 3 if length < 0.95 else 6
        for _ in range(paragraphs):
            parts.append(" ".join(r.choices(self.sentences, k=r.randint(2, 5))))
        if r.random() < 0.3:
            parts.append("\n".join(f"- {r.choice(_ADVICE)}" for _ in range(r.randint(2, 5))))
        if r.random() < 0.25:
            lang, code = r.choice(_CODE)
            parts.append(f"For example:\n\n```{lang}\n{code}\n```")
        if paragraphs >= 3 and r.random() < 0.5:
            parts.insert(1, f"## {r.choice(_VERBS).capitalize()} {r.choice(_THINGS)}")
        return "\n\n".join(parts)


def _gaps(*, seed: int, count: int, first_role: str) -> Iterator[float]:
    """Seconds between consecutive messages: an answer follows its question within a minute,
    the next question comes minutes (sometimes days) later. Its own RNG, so the timeline can be
    summed in a first pass (to end near "now") and replayed identically in the second."""
    r = random.Random(seed ^ 0x5EED)
    role = first_role
    for _ in range(count):
        if role == MessageRole.ASSISTANT:
            yield r.uniform(2.0, 60.0)
            role = MessageRole.USER
        else:
            yield r.uniform(30.0, 900.0) if r.random() < 0.98 else r.uniform(3600.0, 3 * 86400.0)
            role = MessageRole.ASSISTANT


def default_user(*, username: str | None) -> Any:
    """The named user (created if missing); without a name, `admin` when `make run` has made it,
    so the demo shows up in the UI one logs into, else `demo`."""
    user_model = get_user_model()
    if username is None:
        username = "admin" if user_model.objects.filter(username="admin").exists() else "demo"
    user, created = user_model.objects.get_or_create(username=username)
    if created:
        # No password: a seeded account must not be a login anyone can guess.
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def seed_session(
    *,
    user: Any,
    messages: int,
    session_id: int | None = None,
    title: str | None = None,
    batch: int = DEFAULT_BATCH,
    seed: int = DEFAULT_SEED,
    progress: Any = None,
) -> SeedResult:
    """Append `messages` generated messages to a session (a new one unless `session_id` names
    one of `user`'s sessions). `progress(done, total)` is called after every batch."""
    if messages < 0:
        raise ValueError("messages must be >= 0")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    started = time.perf_counter()
    now = timezone.now()
    session, last = _session_target(
        user=user, session_id=session_id, title=title or f"Demo: {messages:,} messages", now=now
    )
    # Continue the conversation's rhythm: after a question comes its answer.
    first_role = (
        MessageRole.ASSISTANT if last is not None and last.role == MessageRole.USER else "user"
    )
    # The seeded history ends about now (so "last activity" looks live), but never before a
    # message the session already has: created_at must keep increasing with the id.
    total = sum(_gaps(seed=seed, count=messages, first_role=first_role))
    start: datetime = now - timedelta(seconds=total)
    if last is not None and start <= last.created_at:
        start = last.created_at + timedelta(seconds=1)
    rows = _messages(session=session, seed=seed, count=messages, first_role=first_role, start=start)
    done = 0
    while done < messages:
        done += _batch_store(session=session, rows=list(islice(rows, batch)))
        if progress is not None:
            progress(done, messages)
    return SeedResult(session_id=session.pk, created=done, seconds=time.perf_counter() - started)


def _session_target(
    *, user: Any, session_id: int | None, title: str, now: datetime
) -> tuple[ChatSession, ChatMessage | None]:
    """The session to append to (a new one, or `user`'s `session_id`) and its last message."""
    if session_id is None:
        return ChatSession.objects.create(owner=user, title=title, created_at=now), None
    try:
        session = ChatSession.objects.get(pk=session_id, owner=user)
    except ChatSession.DoesNotExist:
        raise ValueError(f"session {session_id} does not exist or is not owned by {user}") from None
    return session, session.messages.order_by("-id").only("role", "created_at").first()


def _messages(
    *, session: ChatSession, seed: int, count: int, first_role: str, start: datetime
) -> Iterator[ChatMessage]:
    """The generated messages, unsaved, questions and answers taking turns from `first_role`."""
    # Seed per session too, so two demo sessions made with the same seed do not read alike.
    writer = _Writer(rng=random.Random(seed * 1_000_003 + session.pk))
    role = first_role
    at = start
    turn = 0
    for gap in _gaps(seed=seed, count=count, first_role=first_role):
        at += timedelta(seconds=gap)
        if role == MessageRole.USER:
            turn += 1
            content = writer.question(turn=turn)
        else:
            content = writer.answer()
        yield ChatMessage(
            session_id=session.pk,
            role=role,
            content=content,
            status=MessageStatus.COMPLETE,
            created_at=at,
            metadata={},
        )
        role = MessageRole.ASSISTANT if role == MessageRole.USER else MessageRole.USER


def _batch_store(*, session: ChatSession, rows: list[ChatMessage]) -> int:
    """Insert one batch and count it on the session; returns how many were inserted."""
    with transaction.atomic():
        # Rows inserted in one statement get increasing ids in list order on both
        # backends, so id order and created_at order agree.
        ChatMessage.objects.bulk_create(rows, batch_size=len(rows))
        # Counted per batch, in the same transaction: an interrupted run leaves the
        # counter true to what is stored instead of off by everything inserted so far.
        ChatSession.objects.filter(pk=session.pk).counters_add(
            messages=len(rows), at=rows[-1].created_at
        )
    return len(rows)


class Command(BaseCommand):
    help = "Create one long, realistic demo session (deterministic, offline, bulk inserted)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--messages", type=int, required=True, help="how many to create")
        parser.add_argument("--user", default=None, help="owner (default: admin, else demo)")
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--session-id", type=int, default=None, help="append to this one")
        target.add_argument("--title", default=None, help="title of the new session")
        parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows per INSERT")
        parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="RNG seed")

    def handle(self, *args: Any, **options: Any) -> None:
        messages: int = options["messages"]
        if messages < 1:
            raise CommandError("--messages must be at least 1")
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        user = default_user(username=options["user"])
        # A tick every ~10% so a million-row run shows it is alive without flooding the log.
        step = max(options["batch"], messages // 10)
        next_report = step

        def progress(done: int, total: int) -> None:
            nonlocal next_report
            if done >= next_report or done == total:
                self.stderr.write(f"  {done:,}/{total:,}")
                next_report += step

        try:
            result = seed_session(
                user=user,
                messages=messages,
                session_id=options["session_id"],
                title=options["title"],
                batch=options["batch"],
                seed=options["seed"],
                progress=progress if options["verbosity"] >= 1 else None,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"session_id={result.session_id} user={user.get_username()} "
            f"messages={result.created} seconds={result.seconds:.1f} "
            f"rate={result.rate:,.0f} msg/s"
        )
