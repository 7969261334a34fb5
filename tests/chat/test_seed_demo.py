"""seed_demo: the data the history benchmark measures must look like a real conversation and
keep the invariants the history API relies on (id order == time order, a true message_count)."""

from __future__ import annotations

import itertools
import random
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from chat.management.commands.seed_demo import _Writer, seed_session
from chat.models import ChatSession, MessageRole
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _user(username: str) -> Any:
    # factory-boy's call is typed as returning the factory; the tests want the model instance.
    return UserFactory(username=username)


def _run(*args: str) -> str:
    out = StringIO()
    call_command("seed_demo", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _session_from(output: str) -> ChatSession:
    session_id = int(output.split("session_id=", 1)[1].split()[0])
    return ChatSession.objects.get(pk=session_id)


def test_creates_an_alternating_monotonic_conversation() -> None:
    # A batch smaller than the total, so several INSERT batches have to line up.
    out = _run("--messages", "301", "--batch", "64", "--user", "alice")
    session = _session_from(out)
    assert "rate=" in out
    assert session.owner.username == "alice"
    assert session.message_count == 301

    rows = list(session.messages.order_by("id").values_list("id", "role", "created_at", "content"))
    assert len(rows) == 301
    assert [r[1] for r in rows] == [
        MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT for i in range(301)
    ]
    ids = [r[0] for r in rows]
    times = [r[2] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(a < b for a, b in itertools.pairwise(times))
    assert session.last_activity_at == times[-1]
    assert all(r[3].strip() for r in rows)
    # Varied, not one string repeated; some answers carry markdown code blocks.
    assert len({r[3] for r in rows}) > 200
    assert any("```" in r[3] for r in rows if r[1] == MessageRole.ASSISTANT)


def test_text_is_deterministic_and_new_user_has_no_usable_password() -> None:
    first = _session_from(_run("--messages", "40", "--title", "one", "--user", "bob"))
    second = _session_from(_run("--messages", "40", "--title", "two", "--user", "bob"))
    assert first.title == "one" and second.title == "two"
    assert not first.owner.has_usable_password()
    # The same seed renders the same conversation (benchmarks compare like with like).
    one, two = _Writer(rng=random.Random(7)), _Writer(rng=random.Random(7))
    assert [one.answer() for _ in range(20)] == [two.answer() for _ in range(20)]
    assert [one.question(turn=i) for i in range(20)] == [two.question(turn=i) for i in range(20)]


def test_appends_to_an_existing_session_continuing_roles_and_time() -> None:
    user = _user("carol")
    first = seed_session(user=user, messages=5, title="grow")
    seed_session(user=user, messages=6, session_id=first.session_id, batch=4)
    session = ChatSession.objects.get(pk=first.session_id)
    assert session.message_count == 11
    rows = list(session.messages.order_by("id").values_list("role", "created_at"))
    assert [r[0] for r in rows] == [
        MessageRole.USER if i % 2 == 0 else MessageRole.ASSISTANT for i in range(11)
    ]
    assert all(a[1] < b[1] for a, b in itertools.pairwise(rows))


def test_defaults_to_admin_when_it_exists() -> None:
    _user("admin")
    session = _session_from(_run("--messages", "2"))
    assert session.owner.username == "admin"


def test_rejects_someone_elses_session() -> None:
    _user("dave")
    other = seed_session(user=_user("erin"), messages=2)
    with pytest.raises(CommandError):
        _run("--messages", "2", "--user", "dave", "--session-id", str(other.session_id))
    with pytest.raises(CommandError):
        _run("--messages", "0")


# --- The benchmark's own code path (no timings here: only that it measures the right thing) ---


def test_offset_baseline_pages_the_same_messages_as_the_history_api(settings) -> None:
    from rest_framework.test import APIClient

    settings.ROOT_URLCONF = "bench.urls"
    user = _user("frank")
    sid = seed_session(user=user, messages=120, title="paged").session_id
    client = APIClient()
    client.force_authenticate(user)

    newest = client.get("/api/v1/chat/history", {"session_id": sid, "limit": 50}).json()
    tail = client.get("/bench/offset-history", {"session_id": sid, "offset": 70}).json()
    assert tail["count"] == 120
    assert [m["id"] for m in tail["messages"]] == [m["id"] for m in newest["messages"]]
    assert tail["messages"] == newest["messages"]  # same serializer, same fields

    head = client.get("/bench/offset-history", {"session_id": sid, "offset": 0}).json()
    first_ids = list(
        ChatSession.objects.get(pk=sid).messages.order_by("id").values_list("id", flat=True)[:50]
    )
    assert [m["id"] for m in head["messages"]] == first_ids
    # The ownership check is the app's: someone else's session is a 404 here too.
    other = APIClient()
    other.force_authenticate(_user("grace"))
    assert other.get("/bench/offset-history", {"session_id": sid}).status_code == 404


def test_report_rewrites_only_its_own_section(tmp_path) -> None:
    from bench.report import write_section

    doc = tmp_path / "benchmarks.md"
    write_section(path=doc, name="history", body="first run")
    write_section(path=doc, name="other", body="kept \\1 as is")
    write_section(path=doc, name="history", body="second run")
    text = doc.read_text()
    assert "second run" in text and "first run" not in text
    assert "kept \\1 as is" in text
    assert text.index("second run") < text.index("kept")
    assert text.count("<!-- bench:history:begin -->") == 1
