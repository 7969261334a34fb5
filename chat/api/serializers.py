"""Request validation and the JSON shapes of the v1 contract (docs/api.md).

Query-string serializers turn every malformed parameter into a 400 before anything touches the
database; response serializers exist so the OpenAPI document describes the real shapes."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from chat.api.fields import (
    BodySerializer,
    CursorField,
    LineField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    id_field,
)
from chat.models import ChatMessage, ChatSession, ContextSnapshot, SnapshotOutcome
from chat.selectors import session_budget
from chat.shapes import message_payload

TITLE_MAX: int = ChatSession._meta.get_field("title").max_length or 200


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.JSONField(required=False)


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class ContextBudgetSerializer(serializers.Serializer):
    used_runes = serializers.IntegerField()
    limit_runes = serializers.IntegerField()
    used_pct = serializers.FloatField()


class SessionSerializer(serializers.ModelSerializer):
    agent_id = serializers.IntegerField(read_only=True, allow_null=True)
    context_budget = serializers.SerializerMethodField()

    class Meta:
        model = ChatSession
        fields = [
            "id",
            "title",
            "agent_id",
            "model",
            "created_at",
            "updated_at",
            "message_count",
            "context_budget",
        ]
        read_only_fields = fields

    @extend_schema_field(ContextBudgetSerializer)
    def get_context_budget(self, obj: ChatSession) -> dict[str, Any]:
        return session_budget(session=obj)


class MessageSerializer(serializers.ModelSerializer):
    """The contract's message object. The fields describe it for the schema; the object itself is
    `message_payload`'s, the one every event carries (tests/chat/test_shapes.py)."""

    session_id = serializers.IntegerField(read_only=True)
    tool_call_id = serializers.CharField(read_only=True, allow_null=True)

    class Meta:
        model = ChatMessage
        fields = [
            "id",
            "session_id",
            "role",
            "content",
            "status",
            "created_at",
            "client_id",
            "tool_calls",
            "tool_call_id",
            "metadata",
        ]
        read_only_fields = fields

    def to_representation(self, instance: ChatMessage) -> dict[str, Any]:
        return message_payload(instance)


class SnapshotSerializer(serializers.ModelSerializer):
    """`error` in full for staff (context `staff`); others learn only that there was one: it
    holds what the model server answered."""

    class Meta:
        model = ContextSnapshot
        fields = ("id", *ContextSnapshot.INSPECTION_FIELDS)
        read_only_fields = fields

    def to_representation(self, instance: ContextSnapshot) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        failed = instance.outcome in (SnapshotOutcome.FAILED, SnapshotOutcome.REJECTED)
        if failed and data.get("error") and not self.context.get("staff"):
            data["error"] = "The summary could not be made (details are in the server log)."
        return data


# --- requests -----------------------------------------------------------------------------------


class SessionListQuerySerializer(serializers.Serializer):
    limit = StrictIntegerField(min_value=1, max_value=100, default=20)
    cursor = CursorField(required=False)


class SessionCreateSerializer(BodySerializer):
    title = LineField(max_length=TITLE_MAX, required=False, allow_blank=True)
    agent_id = id_field(required=False, allow_null=True)


class SessionUpdateSerializer(BodySerializer):
    title = LineField(max_length=TITLE_MAX, allow_blank=False, required=False)
    model = StrictCharField(
        max_length=200,
        allow_blank=True,
        required=False,
        trim_whitespace=True,
        help_text="One of the server's allowed models (`allowed_models` of GET /api/v1/status); "
        "empty for the agent's or the server's default.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Give `title`, `model` or both.")
        return attrs


class HistoryQuerySerializer(serializers.Serializer):
    session_id = id_field()
    limit = StrictIntegerField(min_value=1, max_value=200, default=50)
    before = CursorField(required=False, help_text="older_cursor of a previous page")
    after = CursorField(required=False, help_text="newer_cursor of a previous page")
    around = id_field(required=False, help_text="a message id: the window centred on it")
    cursor = CursorField(required=False, help_text="Deprecated alias of `before`.")
    render = StrictChoiceField(
        choices=["html"],
        required=False,
        help_text="`html`: each reply (assistant message) also carries `content_html` "
        "(sanitised Markdown).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [name for name in ("before", "after", "around", "cursor") if name in attrs]
        if len(given) > 1:
            raise serializers.ValidationError(
                f"Give at most one of before, after, around, cursor (got {', '.join(given)})."
            )
        return attrs


class SearchQuerySerializer(serializers.Serializer):
    # The text's own rules (length, trimming) are the selector's, so REST and the model's tool
    # refuse the same queries with the same words; here only its type and a hard size cap.
    q = StrictCharField(
        allow_blank=True, trim_whitespace=False, max_length=1000, help_text="Text to find."
    )
    session_id = id_field(required=False, help_text="Only this session's messages.")
    role = StrictChoiceField(choices=["user", "assistant", "tool"], required=False)
    before = CursorField(required=False, help_text="next_cursor of a previous page")
    limit = StrictIntegerField(min_value=1, max_value=50, default=20)


class TurnsQuerySerializer(serializers.Serializer):
    session_id = id_field()
    limit = StrictIntegerField(min_value=1, max_value=1000, default=200)
    cursor = CursorField(required=False)


class TruncateRequestSerializer(BodySerializer):
    session_id = id_field()
    message_id = id_field()


class SnapshotsQuerySerializer(serializers.Serializer):
    before = id_field(required=False)
    limit = StrictIntegerField(min_value=1, max_value=50, default=20)


class ContextQuerySerializer(serializers.Serializer):
    snapshots_limit = StrictIntegerField(min_value=0, max_value=100, default=20)


# --- responses (schema) -------------------------------------------------------------------------


class SessionPageSerializer(serializers.Serializer):
    results = SessionSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class HistoryPageSerializer(serializers.Serializer):
    messages = MessageSerializer(many=True, help_text="Oldest first.")
    older_cursor = serializers.CharField(
        allow_null=True, help_text="Pass as `before`; null when the oldest message is included."
    )
    newer_cursor = serializers.CharField(
        help_text="Pass as `after`; at the live edge it fetches messages that arrive later."
    )
    at_live_edge = serializers.BooleanField(help_text="No newer message exists.")
    next_cursor = serializers.CharField(
        allow_null=True, help_text="Same as older_cursor, for old clients."
    )


class TurnSerializer(serializers.Serializer):
    message_id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    preview = serializers.CharField()


class SearchHitSerializer(serializers.Serializer):
    session_id = serializers.IntegerField()
    session_title = serializers.CharField()
    message_id = serializers.IntegerField()
    role = serializers.CharField()
    created_at = serializers.DateTimeField()
    snippet = serializers.CharField(help_text="Plain text around the first match.")
    highlights = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        help_text="[start, end) of each match in `snippet`, in Unicode code points.",
    )


class SearchPageSerializer(serializers.Serializer):
    results = SearchHitSerializer(many=True, help_text="Newest first.")
    next_cursor = serializers.CharField(
        allow_null=True,
        help_text=(
            "Continues the search (pass as `before`); null when nothing older matches. A page "
            "may be short, even empty, and still have one: a query under 3 characters searches "
            "5,000 messages per request."
        ),
    )
    mode = serializers.ChoiceField(
        choices=["index", "scan"], help_text="`scan`: a query too short for the index."
    )


class TurnsPageSerializer(serializers.Serializer):
    turns = TurnSerializer(many=True, help_text="The user's questions, newest first.")
    next_cursor = serializers.CharField(allow_null=True, help_text="The next, older page.")


class TruncateResponseSerializer(serializers.Serializer):
    deleted = serializers.IntegerField()
    summary_rewound = serializers.BooleanField()
    cancelled_reply_id = serializers.IntegerField(
        allow_null=True, help_text="The reply that was generating and was stopped first."
    )
    context_budget = ContextBudgetSerializer()


class SessionContextSerializer(serializers.Serializer):
    context_summary = serializers.CharField(allow_blank=True)
    verbatim_since_message_id = serializers.IntegerField(allow_null=True)
    context_budget = ContextBudgetSerializer()
    snapshots = SnapshotSerializer(many=True, help_text="Newest first.")


class SummaryInForceSerializer(serializers.Serializer):
    text = serializers.CharField(allow_blank=True, help_text="The session's summary now.")
    heading = serializers.CharField(
        help_text="The line it goes under in the system message the model is sent."
    )
    verbatim_since_message_id = serializers.IntegerField(
        allow_null=True, help_text="Messages from this id on are sent word for word."
    )


class SnapshotsPageSerializer(serializers.Serializer):
    summary = SummaryInForceSerializer()
    snapshots = SnapshotSerializer(many=True, help_text="Newest first.")
    next_before = serializers.IntegerField(
        allow_null=True, help_text="Pass as `before` for the next, older page."
    )


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField()
