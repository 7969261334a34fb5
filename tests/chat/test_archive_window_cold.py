"""A send that finds no recall window kept (chat/search/archive_window.py `cold_rows`): it
recalls from the archive's newest rows only, and the whole window is read in the background
for the sends after it; a window past its time is used once more while it is read again; a
truncation above a window's bound keeps it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.context.compose import RECALL_HEADING
from chat.errors import SearchTimeout
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search import archive_window, recall_warm
from chat.search import recall_auto as recall_auto_module
from chat.search.archive_window import archive_window_read
from chat.search.recall_auto import recall_auto
from chat.services.sessions import message_truncate
from devtools.introspect import background_wait
from tests.chat.recall_setup import (
    FORGETFUL_SUMMARY,
    archived,
    recall_ask,
    recall_settings,
    send,
)
from tests.factories import ChatSessionFactory, make_conversation


def _version(session: ChatSession) -> int:
    return ChatSession.objects.values_list("messages_version", flat=True).get(pk=session.pk)


def _read(session: ChatSession, *, below_id: int, size: int = 10, cold_rows: int = 0):
    return archive_window_read(
        owner_id=session.owner_id,
        session_id=session.pk,
        below_id=below_id,
        size=size,
        version=_version(session),
        cold_rows=cold_rows,
    )


def _kept(session: ChatSession):
    return archive_window._windows.get((session.owner_id, session.pk))


@pytest.mark.django_db
def test_with_none_kept_only_the_newest_rows_are_read_and_not_kept(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    cold = _read(session, below_id=ids[30], cold_rows=4)
    assert [r.id for r in cold.rows] == ids[26:30][::-1]
    assert cold.read_again and cold.more and _kept(session) is None
    # Without cold_rows (the background read): the whole window, kept.
    whole = _read(session, below_id=ids[30])
    assert [r.id for r in whole.rows] == ids[20:30][::-1]
    assert not whole.read_again and _kept(session) is whole
    # Found kept, a send's cold_rows change nothing.
    assert _read(session, below_id=ids[30], cold_rows=4) is whole


@pytest.mark.django_db
def test_a_short_archive_read_cold_is_all_there_is_and_kept(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=2)]
    window = _read(session, below_id=ids[3], cold_rows=4)
    assert [r.id for r in window.rows] == ids[:3][::-1]
    assert not window.read_again and not window.more and _kept(session) is window


@pytest.mark.django_db
def test_a_window_past_its_time_serves_a_send_once_more_and_is_read_again(owner, monkeypatch):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    clock = [1000.0]
    monkeypatch.setattr(archive_window, "monotonic", lambda: clock[0])
    whole = _read(session, below_id=ids[30])
    clock[0] += archive_window.ENTRY_SECONDS + 1
    with CaptureQueriesContext(connection) as reads:
        served = _read(session, below_id=ids[30], cold_rows=4)
    assert len(reads) == 1  # the version only, in _version: no rows read
    assert served.read_again and not served.partial and served.rows == whole.rows
    # The background read does not take it: read anew.
    with CaptureQueriesContext(connection) as reads:
        anew = _read(session, below_id=ids[30])
    assert len(reads) == 2 and anew is not whole and not anew.read_again
    # Past twice its time (its read again never came: the warming queue was full), a send
    # no longer takes it: it reads the newest rows, as with none kept.
    clock[0] += 2 * archive_window.ENTRY_SECONDS
    cold = _read(session, below_id=ids[30], cold_rows=4)
    assert cold.partial and [r.id for r in cold.rows] == ids[26:30][::-1]


@pytest.mark.django_db
def test_a_truncation_above_the_bound_keeps_the_window(owner, django_capture_on_commit_callbacks):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    kept = _read(session, below_id=ids[30])
    with django_capture_on_commit_callbacks(execute=True):
        message_truncate(session=session, message_id=ids[36])
    with CaptureQueriesContext(connection) as reads:
        after = _read(session, below_id=ids[30])
    assert len(reads) == 1  # the version only, in _version: no rows read
    assert after.rows == kept.rows and after.version == _version(session)
    # A cut under the bound (the rows it deleted were in the window): not carried forward.
    with django_capture_on_commit_callbacks(execute=True):
        message_truncate(session=session, message_id=ids[24])
    assert _kept(session).version == _version(session) - 1
    again = _read(session, below_id=ids[24])
    assert [r.id for r in again.rows] == ids[14:24][::-1]
    assert all(r.id < ids[24] for r in again.rows)


@pytest.mark.django_db(transaction=True)
def test_a_send_with_none_kept_recalls_from_the_newest_rows_and_has_the_whole_read(
    api, owner, fake_llm, settings, tmp_path, monkeypatch
):
    """Through the real send: the first send recalls what the newest rows hold (a fact older
    than them is not found by its common words), and leaves the whole window kept; the next
    send finds the older fact."""
    recall_settings(settings, tmp_path)
    monkeypatch.setattr(recall_auto_module, "COLD_WINDOW_ROWS", 6)
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=40, words=12)
    rows = make_conversation(session, turns=20, words=12)
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary=FORGETFUL_SUMMARY, verbatim_since_message_id=rows[20].pk
    )
    session.refresh_from_db()
    submitted: list[dict] = []
    real = recall_warm.warm_submit

    def counted(key, fn, **kwargs):
        submitted.append(kwargs)
        return real(key, fn, **kwargs)

    monkeypatch.setattr(recall_warm, "warm_submit", counted)
    fake_llm.script("Sure.")
    send(api, session, "what was question 3 about?")
    first = fake_llm.calls[-1].raw_body.decode()
    # "question" is in every row of the newest six: not rare there, not looked up below.
    assert RECALL_HEADING in first and "question 3 question 3" not in first
    # At the send's bound (its tail's first message) and version.
    assert len(submitted) == 1 and submitted[0]["below_id"] >= rows[20].pk
    assert submitted[0] | {"below_id": 0} == {
        "session_id": session.pk,
        "owner_id": owner.pk,
        "below_id": 0,
        "version": session.messages_version,
        "size": 1000,
    }
    background_wait()
    assert _kept(session) is not None and len(_kept(session).rows) > 6
    fake_llm.script("Sure.")
    send(api, session, "what was question 3 about?")
    assert "question 3 question 3" in fake_llm.calls[-1].raw_body.decode()
    assert len(submitted) == 1
    assert ChatMessage.objects.filter(session=session).count() == 124


@pytest.mark.django_db
def test_a_background_read_in_steps_reads_the_same_rows(owner, monkeypatch):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    version = _version(session)
    monkeypatch.setattr(archive_window, "STEP_ROWS", 3)
    read = {"owner_id": owner.pk, "session_id": session.pk, "size": 10, "version": version}
    with CaptureQueriesContext(connection) as reads:
        stepped = archive_window_read(below_id=ids[30], in_steps=True, **read)
    assert len(reads) == 4  # 3 + 3 + 3 + 1
    assert [r.id for r in stepped.rows] == ids[20:30][::-1] and stepped.more
    archive_window.archive_windows_forget()
    assert archive_window_read(below_id=ids[30], **read).rows == stepped.rows
    # An archive shorter than the window: the last step comes back short, and nothing more.
    archive_window.archive_windows_forget()
    with CaptureQueriesContext(connection) as reads:
        short = archive_window_read(below_id=ids[5], in_steps=True, **read)
    assert len(reads) == 2 and [r.id for r in short.rows] == ids[:5][::-1] and not short.more


def _cold_lookups(monkeypatch, *, out_of_time: int = 0) -> list[list[str]]:
    """Recall called directly, cold: no background read asked for (a test's transaction is not
    a thread's), and the terms of each index lookup noted; the `out_of_time`th runs out."""
    monkeypatch.setattr(recall_warm, "warm_submit", lambda key, fn, **kwargs: None)
    asked: list[list[str]] = []
    looked_up = recall_auto_module.index_hits_many

    def spy(**kwargs):
        asked.append(list(kwargs["queries"]))
        if len(asked) == out_of_time:
            raise SearchTimeout("out of time")
        return looked_up(**kwargs)

    monkeypatch.setattr(recall_auto_module, "index_hits_many", spy)
    return asked


@pytest.mark.django_db
def test_a_cold_send_looks_up_below_its_rows_a_term_they_hold_once(owner, monkeypatch):
    """The newest rows stand for less of the archive than a whole window: a term one of them
    holds is still looked up in the index below them (COLD_RARE_SHARE), and the older turn
    holding it is found."""
    rows = [(MessageRole.USER, "The spare key hides under the hedgehog statue.")]
    rows += [(MessageRole.USER, f"filler chatter number {i} about lunch") for i in range(160)]
    rows += [(MessageRole.USER, "I saw a hedgehog in the garden today.")]
    rows += [(MessageRole.USER, f"more chatter number {i} about tea") for i in range(10)]
    session = archived(owner, rows)
    asked = _cold_lookups(monkeypatch)
    # "hedgehog" is the only term: one of the newest 150 rows holds it.
    recalled = recall_auto(recall_ask(session, "and the hedgehog?"))
    assert _kept(session) is None  # a cold read: 150 of 172 rows
    assert asked == [["hedgehog"]]
    assert any("hedgehog statue" in m.content for m in recalled)


@pytest.mark.django_db
def test_a_background_read_never_replaces_a_newer_window(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    version = _version(session)
    read = {"owner_id": owner.pk, "session_id": session.pk, "size": 10}
    newer = archive_window_read(below_id=ids[32], version=version, **read)
    # A job a send asked for at an older bound, or at an older version, runs late.
    archive_window_read(below_id=ids[30], version=version, in_steps=True, **read)
    archive_window_read(below_id=ids[34], version=version - 1, in_steps=True, **read)
    assert _kept(session) is newer


@pytest.mark.django_db
def test_the_job_of_a_session_edited_since_reads_nothing(owner, monkeypatch):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    version = _version(session)
    ChatSession.objects.filter(pk=session.pk).update(messages_version=version + 1)
    job = {"session_id": session.pk, "owner_id": owner.pk, "below_id": ids[30], "size": 10}
    recall_warm._window_read(version=version, **job)
    assert _kept(session) is None
    # Another owner's id finds no session: nothing read either.
    recall_warm._window_read(version=version + 1, **(job | {"owner_id": owner.pk + 1}))
    assert _kept(session) is None
    recall_warm._window_read(version=version + 1, **job)
    assert [r.id for r in _kept(session).rows] == ids[20:30][::-1]


@pytest.mark.django_db
def test_a_cold_sends_commoner_terms_are_a_statement_of_their_own(owner, monkeypatch):
    """Past the three rarest, a cold send's terms are looked up apart, under a short deadline:
    one running out of time costs the rarest terms' matches nothing."""
    rows = [(MessageRole.USER, "The hippopotamus ate the spare key.")]
    rows += [(MessageRole.USER, f"filler chatter number {i} about lunch") for i in range(160)]
    session = archived(owner, rows)
    asked = _cold_lookups(monkeypatch, out_of_time=2)
    question = "hippopotamus rhinoceros elephant giraffe zebra"
    recalled = recall_auto(recall_ask(session, question))
    assert [len(terms) for terms in asked] == [3, 2]
    assert asked[0][0].startswith("hippopotam")  # the longest of equally rare terms first
    assert any("hippopotamus ate" in m.content for m in recalled)
