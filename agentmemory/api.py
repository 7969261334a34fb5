"""/api/v1/agents/{id}/memory/...: read an agent's daily notes, and list/read/create/delete its
long-term entries. Thin views: ownership through `agent_for_user` (404 for anything not the
caller's), names checked by the store (UnsafeName -> 400)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentmemory import store
from agentmemory.clock import agent_now
from agentmemory.frontmatter import MAX_TAGS, TAG_RULE, tag_valid
from agentmemory.hooks import entry_payload
from agentmemory.selectors import source_message_for
from chat.api.agents import AGENT_ID_PATH, ERRORS
from chat.api.common import valid
from chat.api.errors import ApiError
from chat.api.fields import (
    BodySerializer,
    StrictCharField,
    StrictDateField,
    StrictIntegerField,
    id_field,
)
from chat.api.throttles import API_THROTTLES, per_user
from chat.rendered import note_html
from chat.selectors import agent_for_user

ENTRY_NAME_PATH = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH, description="Entry name (slug)."
)


class EntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    content = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    created = serializers.DateTimeField()
    updated = serializers.DateTimeField()
    source_session_id = serializers.IntegerField(allow_null=True)
    source_message_id = serializers.IntegerField(allow_null=True)


class EntryListSerializer(serializers.Serializer):
    results = EntrySerializer(many=True)


class TagField(StrictCharField):
    """A tag as the entry's file can hold it: refused, not dropped from what was asked."""

    def to_internal_value(self, data: Any) -> str:
        tag = super().to_internal_value(data).strip().lower()
        if not tag_valid(tag):
            raise serializers.ValidationError(f"A tag is {TAG_RULE}.")
        return tag


class EntryCreateSerializer(BodySerializer):
    content = StrictCharField(
        required=False, allow_blank=True, trim_whitespace=False, max_length=store.ENTRY_MAX_CHARS
    )
    source_message_id = id_field(required=False)
    # One fewer than an entry holds: every created entry is also tagged `remembered`, which a
    # 20th tag pushed out of the file's list.
    tags = serializers.ListField(child=TagField(), required=False, max_length=MAX_TAGS - 1)


class EntryUpdateSerializer(BodySerializer):
    content = StrictCharField(trim_whitespace=False, max_length=store.ENTRY_MAX_CHARS)
    tags = serializers.ListField(child=TagField(), required=False, max_length=MAX_TAGS)


class EntryListQuerySerializer(serializers.Serializer):
    q = StrictCharField(required=False, allow_blank=True, max_length=2000)
    limit = StrictIntegerField(required=False, min_value=1, max_value=500, default=200)


class DailyQuerySerializer(serializers.Serializer):
    date = StrictDateField(required=False, input_formats=["%Y-%m-%d"])


class DailySerializer(serializers.Serializer):
    date = serializers.DateField()
    markdown = serializers.CharField()
    html = serializers.CharField(help_text="The note rendered for reading (sanitised HTML).")
    days = serializers.ListField(child=serializers.DateField())


# The note's bookkeeping, for the program that appends to it, not for a reader: the flush
# markers (HTML comments, which the renderer would show as text: raw HTML is off) and the
# message ids after each role.
_NOTE_MARKER_RE = re.compile(r"^<!-- cadau:[^\n]*-->\s*$", re.MULTILINE)
_NOTE_ROLE_ID_RE = re.compile(r"^(\*\*[a-z]+\*\*) \(#[0-9]+\):", re.MULTILINE)


def daily_note_html(*, agent_id: str, day: date, markdown: str) -> str:
    """A daily note as the page shows it: Markdown through the chat's sanitising renderer,
    without the bookkeeping (rendered once per process, and bounded: chat/rendered.py)."""
    readable = _NOTE_ROLE_ID_RE.sub(r"\1:", _NOTE_MARKER_RE.sub("", markdown))
    return note_html(agent_id=agent_id, day=day.isoformat(), markdown=readable)


@contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except store.FolderNotOwned as exc:
        # An operator's matter (agentmemory/folders.py): say so, without the folder's name.
        raise ApiError(
            "this agent's memory folder exists but is not marked as its own; an operator "
            "must check it",
            code="memory_folder_not_owned",
            status_code=409,
        ) from exc
    except store.MemoryFull as exc:
        raise ApiError(str(exc), code="memory_full", status_code=409) from exc
    except store.UnsafeName as exc:
        raise ApiError(str(exc) or "unsafe name", code="invalid_name") from exc
    except store.TooLarge as exc:
        raise ApiError(str(exc), code="too_large") from exc
    except store.MemoryNotFound as exc:
        raise ApiError("Not found.", code="not_found", status_code=404) from exc


class DailyNoteView(APIView):
    @extend_schema(
        operation_id="agent_memory_daily",
        parameters=[AGENT_ID_PATH, DailyQuerySerializer],
        responses={200: DailySerializer, **ERRORS},
        description="One day's note (default: today) and the days that have a note.",
    )
    def get(self, request: Request, agent_id: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        query = valid(DailyQuerySerializer, request.query_params)
        # "Today" is the agent's, as its notes are dated (agentmemory/clock.py).
        day: date = query.get("date") or agent_now(agent=agent).date()
        with _store_errors():
            markdown = store.daily_note_read(agent_id=agent.pk, day=day)
            days = store.daily_note_list(agent_id=agent.pk)
        return Response(
            {
                "date": day.isoformat(),
                "markdown": markdown,
                "html": daily_note_html(agent_id=str(agent.pk), day=day, markdown=markdown),
                "days": [d.isoformat() for d in days],
            }
        )


class EntryListCreateView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("memory_entry_create")]

    @extend_schema(
        operation_id="agent_memory_entries_list",
        parameters=[AGENT_ID_PATH, EntryListQuerySerializer],
        responses={200: EntryListSerializer, **ERRORS},
        description="Entries, newest first; with `q`, the BM25 matches best first.",
    )
    def get(self, request: Request, agent_id: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        query = valid(EntryListQuerySerializer, request.query_params)
        with _store_errors():
            if query.get("q"):
                hits = store.entry_search(agent_id=agent.pk, query=query["q"], limit=query["limit"])
                entries = [entry for _, entry in hits]
            else:
                entries = store.entry_list(agent_id=agent.pk)[: query["limit"]]
        return Response({"results": [entry_payload(e) for e in entries]})

    @extend_schema(
        operation_id="agent_memory_entries_create",
        parameters=[AGENT_ID_PATH],
        request=EntryCreateSerializer,
        responses={201: EntrySerializer, 200: EntrySerializer, **ERRORS},
        description=(
            'Remember something. With `source_message_id` (the "Remember" action on a '
            "message) `content` defaults to that message's text. 201 when a new entry was "
            "made, 200 when an existing (near-)duplicate was updated instead."
        ),
    )
    def post(self, request: Request, agent_id: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        data = valid(EntryCreateSerializer, request.data)
        session_id = message_id = None
        content = data.get("content", "")
        if "source_message_id" in data:
            source = source_message_for(
                user=request.user, agent=agent, message_id=data["source_message_id"]
            )
            session_id, message_id = source.session_id, source.pk
            content = content or source.content
        if not content.strip():
            raise ApiError("content must be a non-empty string", code="invalid")
        with _store_errors():
            try:
                result = store.entry_write(
                    agent_id=agent.pk,
                    name=None,
                    content=content,
                    source_session_id=session_id,
                    source_message_id=message_id,
                    tags=[*data.get("tags", []), "remembered"],
                )
            except (store.UnsafeName, store.TooLarge):
                raise
            except ValueError as exc:
                raise ApiError(str(exc), code="invalid") from exc
        return Response(
            entry_payload(result.entry),
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )


class EntryDetailView(APIView):
    @extend_schema(
        operation_id="agent_memory_entries_retrieve",
        parameters=[AGENT_ID_PATH, ENTRY_NAME_PATH],
        responses={200: EntrySerializer, **ERRORS},
    )
    def get(self, request: Request, agent_id: str, name: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        with _store_errors():
            entry = store.entry_read(agent_id=agent.pk, name=name)
        return Response(entry_payload(entry))

    @extend_schema(
        operation_id="agent_memory_entries_update",
        parameters=[AGENT_ID_PATH, ENTRY_NAME_PATH],
        request=EntryUpdateSerializer,
        responses={200: EntrySerializer, **ERRORS},
        description=(
            "Replace an entry's text, and its tags when given ([] clears them); 404 if it is "
            "gone (an edit never creates one)."
        ),
    )
    def patch(self, request: Request, agent_id: str, name: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        data = valid(EntryUpdateSerializer, request.data)
        if not data["content"].strip():
            raise ApiError("content must be a non-empty string", code="invalid")
        with _store_errors():
            try:
                entry = store.entry_update(
                    agent_id=agent.pk, name=name, content=data["content"], tags=data.get("tags")
                )
            except (store.UnsafeName, store.TooLarge, store.MemoryNotFound):
                raise
            except ValueError as exc:
                raise ApiError(str(exc), code="invalid") from exc
        return Response(entry_payload(entry))

    @extend_schema(
        operation_id="agent_memory_entries_destroy",
        parameters=[AGENT_ID_PATH, ENTRY_NAME_PATH],
        responses={204: None, **ERRORS},
    )
    def delete(self, request: Request, agent_id: str, name: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        with _store_errors():
            deleted = store.entry_delete(agent_id=agent.pk, name=name)
        if not deleted:
            raise ApiError("Not found.", code="not_found", status_code=404)
        return Response(status=status.HTTP_204_NO_CONTENT)
