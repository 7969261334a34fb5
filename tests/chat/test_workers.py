"""Background work gives way to sends on their way to their first token (chat/workers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from unittest.mock import patch

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

import chat.turn.generate as turn_generate
from chat import workers
from chat.context import context_compact
from chat.middleware import TurnForegroundMiddleware
from chat.workers import background_submit, background_yield, foreground_enter, foreground_exit
from devtools.introspect import background_wait
from tests.chat.recall_setup import FORGETFUL_SUMMARY, recall_settings
from tests.factories import ChatSessionFactory, make_conversation


@pytest.fixture(autouse=True)
def _no_sends_left_on_their_way():
    yield
    with workers._foreground_changed:
        workers._foreground.clear()
        workers._foreground_changed.notify_all()  # a job still waiting goes on


@pytest.fixture
def _long_waits(monkeypatch):
    """Waits long enough that a test's timing can only pass for the reason it names."""
    monkeypatch.setattr(workers, "YIELD_MAX_SECONDS", 30.0)
    monkeypatch.setattr(workers, "YIELD_JOB_SECONDS", 30.0)
    monkeypatch.setattr(workers, "FOREGROUND_SECONDS", 30.0)


def _yielding_job(done: threading.Event) -> None:
    background_yield()
    done.set()


@pytest.mark.usefixtures("_long_waits")
def test_a_background_job_waits_for_a_send_on_its_way_and_goes_on_when_it_is_through():
    done = threading.Event()
    key = foreground_enter()
    background_submit(_yielding_job, done=done)
    assert not done.wait(0.2)
    foreground_exit(key)
    assert done.wait(5)


def test_work_a_send_waits_on_does_not_wait_for_sends():
    """A compaction a send waits on ("compact first", "compact now") is that send's own work:
    it never waits for the sends on their way, its own among them."""
    key = foreground_enter()
    done = threading.Event()
    try:
        thread = threading.Thread(target=_yielding_job, kwargs={"done": done})
        thread.start()
        assert done.wait(5)
        _yielding_job(done)  # the request's own thread too
    finally:
        foreground_exit(key)


@pytest.mark.usefixtures("_long_waits")
def test_a_send_that_never_reaches_its_first_token_holds_nothing_up_for_long(monkeypatch):
    monkeypatch.setattr(workers, "FOREGROUND_SECONDS", 0.1)
    foreground_enter()  # never exited: a send that failed before its reply started
    done = threading.Event()
    background_submit(_yielding_job, done=done)
    assert done.wait(5)
    assert not workers._foreground


@pytest.mark.usefixtures("_long_waits")
def test_a_busy_process_slows_background_work_down_and_never_stops_it(monkeypatch):
    monkeypatch.setattr(workers, "YIELD_MAX_SECONDS", 0.1)
    key = foreground_enter()
    done = threading.Event()
    started = time.monotonic()
    background_submit(_yielding_job, done=done)
    assert done.wait(5)
    assert time.monotonic() - started < 2
    foreground_exit(key)


def _many_yields(steps: int, finished: list[float]) -> None:
    started = time.monotonic()
    for _ in range(steps):
        background_yield()
    finished.append(time.monotonic() - started)


@pytest.mark.usefixtures("_long_waits")
def test_sends_that_never_stop_coming_delay_a_job_by_its_budget_at_most(monkeypatch):
    """A flood of requests to the send route (they count from their arrival, before they are
    authenticated) keeps the process busy all the time: a job's steps go on once its budget is
    spent."""
    monkeypatch.setattr(workers, "YIELD_MAX_SECONDS", 0.2)
    monkeypatch.setattr(workers, "YIELD_JOB_SECONDS", 0.5)
    key = foreground_enter()
    finished: list[float] = []
    job = background_submit(_many_yields, steps=50, finished=finished)
    job.result(timeout=10)
    foreground_exit(key)
    assert 0.4 < finished[0] < 3


@pytest.mark.parametrize("route", ["send", "regenerate"])
@pytest.mark.django_db(transaction=True)
def test_a_turn_is_on_its_way_from_its_checks_until_its_reply_is_out(owner, api, fake_llm, route):
    session = ChatSessionFactory.create(owner=owner)
    body = {"session_id": session.pk, "content": "hi"}
    if route == "regenerate":
        assert api.post("/api/v1/chat/send", body, format="json").status_code == 200
        body = {"session_id": session.pk}
    on_its_way: list[int] = []
    real = turn_generate.foreground_exit

    def spy(key: object) -> None:
        on_its_way.append(len(workers._foreground))
        real(key)

    fake_llm.script("Hello there.")
    with patch.object(turn_generate, "foreground_exit", spy):
        r = api.post(f"/api/v1/chat/{route}", body, format="json")
    assert r.status_code == 200, r.content
    assert on_its_way and on_its_way[0] == 1
    assert not workers._foreground


@pytest.mark.django_db(transaction=True)
def test_a_refused_send_and_a_repeated_one_leave_nothing_on_its_way(owner, api, fake_llm):
    session = ChatSessionFactory.create(owner=owner)
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": ""}, format="json")
    assert r.status_code == 400
    assert not workers._foreground
    body = {"session_id": session.pk, "content": "hi", "client_id": "c-1"}
    assert api.post("/api/v1/chat/send", body, format="json").status_code == 200
    assert not workers._foreground
    assert api.post("/api/v1/chat/send", body, format="json").status_code == 200
    assert not workers._foreground


@pytest.mark.django_db(transaction=True)
def test_a_background_compaction_calls_the_model_only_once_no_send_is_on_its_way(
    owner, fake_llm, settings, tmp_path, monkeypatch
):
    """The summarising call waits for the send (a one-slot or busy model server would answer
    the summary's ~50 KB prompt first), then the compaction commits as it would have."""
    recall_settings(settings, tmp_path)
    monkeypatch.setattr(workers, "YIELD_MAX_SECONDS", 30.0)
    monkeypatch.setattr(workers, "FOREGROUND_SECONDS", 30.0)
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=12, words=12)
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    key = foreground_enter()
    job = background_submit(context_compact, session_id=session.pk, trigger="manual", force=True)
    with pytest.raises(FutureTimeout):
        job.result(timeout=0.5)
    assert fake_llm.count("summary") == 0
    foreground_exit(key)
    assert job.result(timeout=30).outcome == "committed"
    assert fake_llm.count("summary") == 1


@pytest.mark.parametrize(
    ("method", "path", "held"),
    [
        ("post", "/api/v1/chat/send", 1),
        ("post", "/api/v1/chat/regenerate", 1),
        ("get", "/api/v1/chat/send", 0),
        ("post", "/api/v1/chat/sessions", 0),
    ],
)
def test_a_send_is_on_its_way_from_its_arrival_in_either_mode(method, path, held):
    """Before DRF authenticates, throttles and parses it (the turn service holds it from its
    checks on): the middleware chain's first steps, sync or async."""
    seen: list[int] = []

    def view(request):
        seen.append(len(workers._foreground))
        return HttpResponse("ok")

    async def async_view(request):
        return view(request)

    request = getattr(RequestFactory(), method)(path)
    TurnForegroundMiddleware(view)(request)
    asyncio.run(TurnForegroundMiddleware(async_view)(request))
    assert seen == [held, held]
    assert not workers._foreground


def test_warming_runs_one_job_per_key_and_drops_what_does_not_fit_its_queue(monkeypatch):
    monkeypatch.setattr(workers, "WARM_QUEUE_MAX", 3)
    release = threading.Event()
    ran: list[str] = []

    def job(name: str) -> None:
        release.wait(5)
        ran.append(name)

    first = workers.warm_submit("a", job, name="a")
    assert first is not None
    # "a" is running (or waiting): asked again, it is not queued twice.
    assert workers.warm_submit("a", job, name="a again") is None
    assert workers.warm_submit("b", job, name="b") is not None
    assert workers.warm_submit("c", job, name="c") is not None
    assert workers.warm_submit("d", job, name="d") is None  # three already: dropped
    release.set()
    background_wait()
    assert sorted(ran) == ["a", "b", "c"]
    # Done: the key may be warmed again.
    again = workers.warm_submit("a", job, name="a later")
    assert again is not None
    again.result(5)
    assert ran[-1] == "a later"


async def test_a_users_model_wait_is_theirs_until_the_job_ends_not_until_the_request_does():
    """A client that left while its compaction ran freed the user's place with the job still
    holding one of the pool's two threads (a review)."""
    import asyncio
    import threading

    from chat.errors import CompactionInProgress
    from chat.workers import model_wait_run

    release = threading.Event()
    waiting = asyncio.ensure_future(model_wait_run(release.wait, owner=41, timeout=10))
    await asyncio.sleep(0.05)
    waiting.cancel()  # the client left
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    with pytest.raises(CompactionInProgress):
        await model_wait_run(lambda: None, owner=41)
    assert await model_wait_run(lambda: "theirs", owner=42) == "theirs"
    release.set()
    for _ in range(100):
        try:
            assert await model_wait_run(lambda: "again", owner=41) == "again"
            break
        except CompactionInProgress:
            await asyncio.sleep(0.02)
    else:
        raise AssertionError("the place was never given back")
