"""Automatic chat titles: a session nobody has named gets one when a reply completes.

CHAT_AUTO_TITLE chooses how: `model` (the default) asks the summary model for a few words, in
the background, once per session; `words` takes the first words of the user's message, with no
call; `off`. The offline provider always takes the words. A title is only ever written over an
empty one (a conditional UPDATE), so a name the user gave, even mid-reply, stays. The page
hears about it through a `title` event."""

from __future__ import annotations

import logging
import re
import threading

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat.context.summarise import looks_like_error, summarise_call
from chat.events import event_publish_on_commit
from chat.llm import get_provider
from chat.llm.base import SUMMARY_MARKER, LLMError
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.shapes import title_event
from chat.text import line_plain
from chat.workers import background_submit

logger = logging.getLogger("chat.titles")

TITLE_MAX_RUNES = 60
# What the model is shown of the first exchange: enough to name it, cheap to read.
EXCERPT_RUNES = 1500
TITLE_MAX_TOKENS = 24

TITLE_PROMPT = f"""{SUMMARY_MARKER}
Write a title for the conversation below: at most six words, in the language the user writes
in. Reply with the title only, with no quotes and no full stop."""

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_LEADING_LABEL = re.compile(r"^\s*(title|标题)\s*[:：]\s*", re.IGNORECASE)
# Markdown a first line often starts with (a heading, a quote, a list item) and emphasis marks.
_LINE_START = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d+[.)]\s+)")
_EMPHASIS = re.compile(r"\*+|`+|(?<!\w)_+|_+(?!\w)")

# Sessions whose title call is under way in this process: two quick replies make one call.
_in_flight: set[int] = set()
_in_flight_lock = threading.Lock()


def _plain(line: str) -> str:
    # One clean line, as the API requires of a title it is given (an escape sequence, a
    # bell, DEL: line_problem).
    return line_plain(_EMPHASIS.sub("", _LINE_START.sub("", line)))


def title_from_words(text: str) -> str:
    """The start of `text` as a title: its first line, markup dropped, cut at a word (or, for
    text written without spaces, at 20 characters) with an ellipsis."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    # A line of markup alone ("***") keeps its characters: a session must end up named, or
    # every reply would try again.
    line = _plain(line) or line_plain(line)
    limit = 20 if _CJK.search(line[:40]) and " " not in line[:20] else TITLE_MAX_RUNES
    if len(line) <= limit:
        return line
    cut = line[:limit]
    if " " in cut and limit == TITLE_MAX_RUNES:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,.;:，。；：") + "…"


def title_clean(text: str) -> str:
    """What a model answered, as a title: its first line, without a `Title:` label, quotes,
    markup or a final full stop; "" when nothing usable is left."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _plain(_LEADING_LABEL.sub("", line))
    line = line.strip("\"'“”‘’「」『』《》 ").rstrip("。.")
    if len(line) > TITLE_MAX_RUNES:
        line = line[:TITLE_MAX_RUNES].rstrip() + "…"
    return line


def session_title_auto_set(*, session_id: int, title: str) -> bool:
    """Name an unnamed session and tell its sockets; False when it has a name already."""
    title = title.strip()
    if not title:
        return False
    with transaction.atomic():
        named = ChatSession.objects.filter(pk=session_id, title="").update(
            title=title, updated_at=timezone.now()
        )
        if named:
            event_publish_on_commit(
                session_id=session_id,
                event=title_event(session_id=session_id, title=title),
            )
    return bool(named)


def session_title_after_reply(
    *, session: ChatSession, user_message: ChatMessage | None, reply: ChatMessage
) -> None:
    """Called when a reply is stored. Cheap when the session has a name: nothing is read."""
    mode = settings.CHAT_AUTO_TITLE
    if mode == "off" or session.title or user_message is None:
        return
    if reply.status != MessageStatus.COMPLETE or not user_message.content.strip():
        return
    if mode == "model" and not get_provider().is_offline:
        with _in_flight_lock:
            if session.pk in _in_flight:
                return
            _in_flight.add(session.pk)
        try:
            background_submit(
                _title_from_model,
                session_id=session.pk,
                question=user_message.content,
                answer=reply.content,
            )
        except BaseException:
            with _in_flight_lock:
                _in_flight.discard(session.pk)
            raise
        return
    session_title_auto_set(session_id=session.pk, title=title_from_words(user_message.content))


def _title_from_model(*, session_id: int, question: str, answer: str) -> None:
    try:
        if ChatSession.objects.filter(pk=session_id, title="").exists():
            session_title_auto_set(
                session_id=session_id, title=title_model_call(question=question, answer=answer)
            )
    finally:
        with _in_flight_lock:
            _in_flight.discard(session_id)


def title_model_call(*, question: str, answer: str) -> str:
    """One short call to the summary model; the first words of the question when it fails or
    answers with something that is not a title."""
    content = f"User: {question[:EXCERPT_RUNES]}\n\nAssistant: {answer[:EXCERPT_RUNES]}"
    fallback = title_from_words(question)
    try:
        result = summarise_call(
            instructions=TITLE_PROMPT, content=content, max_tokens=TITLE_MAX_TOKENS
        )
    except LLMError as exc:
        logger.warning("chat_title_call_failed error=%s", str(exc)[:200])
        return fallback
    title = title_clean(result.text or "")
    if not title or looks_like_error(title):
        return fallback
    return title
