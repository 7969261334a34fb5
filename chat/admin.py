"""Operator views. Sized for a million messages: no COUNT(*) over the whole table on every
changelist, no dropdown listing every session, no per-row queries."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import AdminSite
from django.contrib.admin.options import csrf_protect_m
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from chat.errors import ChatError, InvalidInput, SearchTimeout
from chat.models import Agent, ChatMessage, ChatSession, ContextSnapshot, MessageStatus
from chat.search.selectors import message_ids_search_admin
from chat.selectors import rows_cascading, session_budget, sessions_with_budget
from chat.services.agents import agent_config_validate
from chat.services.compaction import session_compact
from chat.services.sessions import (
    session_context_reset,
    session_delete,
    sessions_messages_changed,
    user_sessions_delete,
)
from chat.turn import session_delete_live, session_replies_stop, user_replies_stop
from chat.workers import background_submit

_SNAPSHOT_FIELDS = ContextSnapshot.INSPECTION_FIELDS


def deleted_objects(
    *, queryset: QuerySet[Any], listed: list[Any], request: HttpRequest, admin_site: AdminSite
) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
    """Django's `get_deleted_objects` for a delete confirmation, by counts: Django's collects
    and renders every row that cascades, and for a chat of a million messages (or a user with
    many chats) read them all into one request (chat.selectors.rows_cascading)."""
    cascade = rows_cascading(queryset=queryset)
    counts = {str(m._meta.verbose_name_plural): n for m, n in cascade.counts.items()}
    perms_needed = {
        str(model._meta.verbose_name)
        for model in cascade.counts
        if model is not queryset.model
        and admin_site.is_registered(model)
        and not admin_site.get_model_admin(model).has_delete_permission(request)
    }
    protected = [f"{n} {m._meta.verbose_name_plural}" for m, n in cascade.protected.items()]
    return listed, counts, perms_needed, protected


class RepliesStoppedFirst(admin.ModelAdmin):
    """A delete view that stops the replies generating in what it deletes first, as the
    owner's DELETE does, not leaving them to spend the model under a chat that is gone. Before
    Django's transaction (on SQLite its snapshot would never see a reply settle), and only for
    a request Django will then carry out (CSRF, permission)."""

    def replies_stop(self, obj: Any) -> None:
        raise NotImplementedError

    @csrf_protect_m
    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            obj = self.get_object(request, unquote(object_id))
            if obj is not None and self.has_delete_permission(request, obj):
                self.replies_stop(obj)
        return super().delete_view(request, object_id, extra_context)


class ReadOnlyMixin:
    """Snapshots are an audit trail: written only by the context engine and truncation."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ContextSnapshotInline(ReadOnlyMixin, admin.TabularInline):
    model = ContextSnapshot
    fields = (
        "created_at",
        "outcome",
        "trigger",
        "summary_through_message_id",
        "verbatim_since_message_id",
        "context_version",
        "runes_before",
        "runes_after",
        "model",
        "duration_ms",
        "error",
    )
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    can_delete = False
    show_change_link = True


class AgentAdminForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = ("owner", "name", "system_prompt", "model", "config_json", "created_at")

    def clean_config_json(self) -> Any:
        # The same rules as the API, so the admin cannot store a config the API would refuse.
        try:
            config = self.cleaned_data.get("config_json")
            return agent_config_validate(config={} if config is None else config)
        except ChatError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_owner(self) -> Any:
        # An agent given to another user while chats of the first one use it would give that
        # user's chats the new owner's memory and workspace (ChatSessionAdminForm, the other
        # side of the rule).
        owner = self.cleaned_data.get("owner")
        agent = self.instance
        moved = agent.pk and owner is not None and owner.pk != agent.owner_id
        if moved and ChatSession.objects.filter(agent=agent).exclude(owner=owner).exists():
            raise forms.ValidationError(
                "Chats of another user use this agent: move or delete them first."
            )
        return owner


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentAdminForm
    list_display = ("id", "name", "owner", "model", "created_at")
    list_select_related = ("owner",)
    search_fields = ("name", "owner__username")
    raw_id_fields = ("owner",)


class ChatSessionAdminForm(forms.ModelForm):
    class Meta:
        model = ChatSession
        fields = ("owner", "agent", "title")

    def clean(self) -> dict[str, Any]:
        # As the API (session_create): a chat's agent is its owner's. A chat moved to another
        # user with the first one's agent gave the new owner that agent's memory and
        # workspace through its tools.
        data = super().clean() or {}
        owner, agent = data.get("owner"), data.get("agent")
        if owner is not None and agent is not None and agent.owner_id != owner.pk:
            raise forms.ValidationError(
                "The agent belongs to another user: a chat's agent must be its owner's."
            )
        return data


@admin.register(ChatSession)
class ChatSessionAdmin(RepliesStoppedFirst):
    form = ChatSessionAdminForm
    list_display = (
        "id",
        "title",
        "owner",
        "agent",
        "message_count",
        "verbatim_since_message_id",
        "context_version",
        "budget_pct",
        "last_activity_at",
    )
    list_select_related = ("owner", "agent")
    search_fields = ("title", "owner__username")
    raw_id_fields = ("owner", "agent")
    readonly_fields = (
        "context_budget",
        "context_summary",
        "verbatim_since_message_id",
        "context_version",
        "messages_version",
        "message_count",
        "last_activity_at",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("owner", "agent", "title")}),
        (
            "Rolling context",
            {
                "fields": (
                    "context_budget",
                    "context_summary",
                    "verbatim_since_message_id",
                    "context_version",
                    "messages_version",
                )
            },
        ),
        ("Counters", {"fields": ("message_count", "last_activity_at", "created_at", "updated_at")}),
    )
    inlines = (ContextSnapshotInline,)
    show_full_result_count = False
    actions = ("recompact", "reset_summary")

    def save_model(self, request: HttpRequest, obj: ChatSession, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Only what the form changed: a whole-row save writes back the summary, the anchor and
        # the versions as the form loaded them, undoing a compaction or a truncation committed
        # in between (and a kept archive window would then trust rows since deleted).
        obj.save(update_fields=[*form.changed_data, "updated_at"])

    @admin.action(description="Recompact now (in the background)")
    def recompact(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        # Summarising calls take seconds each; an operator's request must not wait on them.
        ids = list(queryset.values_list("pk", flat=True))
        for session_id in ids:
            background_submit(session_compact, session_id=session_id, trigger="admin", force=True)
        self.message_user(
            request, f"Compaction queued for {len(ids)} session(s); see their snapshots."
        )

    @admin.action(description="Reset summary (all messages verbatim again)")
    def reset_summary(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        count = 0
        for session in queryset:
            session_context_reset(session=session, by=str(request.user))
            count += 1
        self.message_user(request, f"Summary reset for {count} session(s).")

    def replies_stop(self, obj: Any) -> None:
        session_replies_stop(session_id=obj.pk)

    def delete_model(self, request: HttpRequest, obj: ChatSession) -> None:
        session_delete(session=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        # The action (delete_selected) runs outside a transaction: each stops, then goes.
        for session in queryset:
            session_delete_live(session=session)

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        sessions = list(objs)
        listed: list[Any] = []
        for session in sessions:
            listed.extend([f"Chat session: {session}", [f"{session.message_count} messages"]])
        queryset = ChatSession.objects.filter(pk__in=[s.pk for s in sessions])
        return deleted_objects(
            queryset=queryset, listed=listed, request=request, admin_site=self.admin_site
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ChatSession]:
        # The budget column comes from the same annotation the API list uses: one query.
        return sessions_with_budget(super().get_queryset(request))

    @admin.display(description="budget %")
    def budget_pct(self, obj: ChatSession) -> float:
        return float(session_budget(session=obj)["used_pct"])

    @admin.display(description="context budget")
    def context_budget(self, obj: ChatSession) -> str:
        budget = session_budget(session=obj)
        return f"{budget['used_runes']} / {budget['limit_runes']} runes ({budget['used_pct']}%)"


@admin.register(ChatMessage)
class ChatMessageAdmin(RepliesStoppedFirst):
    list_display = ("id", "session", "role", "status", "short_content", "created_at")
    list_filter = ("role", "status")
    list_select_related = ("session",)
    # Searched through the message search index (get_search_results), not `icontains`.
    search_fields = ("content",)
    search_help_text = (
        "Case-insensitive text in the content of every user's messages: the newest 500 "
        "matches (not replies still streaming), which the filters then narrow. Text without "
        "three letters or digits in a row searches the newest 5,000 messages only."
    )
    raw_id_fields = ("session",)
    # Exact COUNT(*) of a million rows on every page load is the admin's usual slow path.
    show_full_result_count = False
    ordering = ("-id",)
    SEARCH_MATCHES = 500

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ChatMessage], search_term: str
    ) -> tuple[QuerySet[ChatMessage], bool]:
        """The admin's own search is `content ILIKE '%term%'`-like through UPPER() on
        PostgreSQL and a full scan on SQLite; the trigram index answers the same question."""
        if not search_term.strip():
            return queryset, False
        try:
            found = message_ids_search_admin(query=search_term, limit=self.SEARCH_MATCHES)
        except (InvalidInput, SearchTimeout) as exc:
            messages.warning(request, str(exc))
            return queryset.none(), False
        return queryset.filter(id__in=found), False

    # An operator may edit or delete a message (a leaked secret redacted): the session's version
    # moves, so that no process recalls what was there before.
    def save_model(self, request: HttpRequest, obj: ChatMessage, form: Any, change: bool) -> None:
        # A message moved to another session leaves the one it was in: both move.
        was_in = (
            ChatMessage.objects.filter(pk=obj.pk).values_list("session_id", flat=True).first()
            if change
            else None
        )
        super().save_model(request, obj, form, change)
        moved = [was_in] if was_in is not None and was_in != obj.session_id else []
        sessions_messages_changed(session_ids=[obj.session_id, *moved])

    def replies_stop(self, obj: Any) -> None:
        # A reply deleted while it generates (a secret it is writing out): stopped first, not
        # left to spend the model and write into a row that is gone.
        if obj.status == MessageStatus.STREAMING:
            session_replies_stop(session_id=obj.session_id)

    def delete_model(self, request: HttpRequest, obj: ChatMessage) -> None:
        super().delete_model(request, obj)
        sessions_messages_changed(session_ids=[obj.session_id])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ChatMessage]) -> None:
        streaming = queryset.filter(status=MessageStatus.STREAMING)
        for session_id in streaming.values_list("session_id", flat=True).distinct():
            session_replies_stop(session_id=session_id)
        session_ids = list(queryset.values_list("session_id", flat=True).distinct())
        # One transaction: no process may read the sessions between the delete and the
        # version move (a truncation then would carry a window holding deleted rows forward).
        with transaction.atomic():
            super().delete_queryset(request, queryset)
            sessions_messages_changed(session_ids=session_ids)

    @admin.display(description="content")
    def short_content(self, obj: ChatMessage) -> str:
        text = " ".join(obj.content.split())
        return text if len(text) <= 80 else text[:79] + "…"


@admin.register(ContextSnapshot)
class ContextSnapshotAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "session",
        "outcome",
        "trigger",
        "summary_through_message_id",
        "verbatim_since_message_id",
        "runes_before",
        "runes_after",
        "created_at",
    )
    list_filter = ("outcome",)
    list_select_related = ("session",)
    raw_id_fields = ("session",)
    fields = ("session", *_SNAPSHOT_FIELDS)
    readonly_fields = fields
    show_full_result_count = False
    ordering = ("-id",)


User = get_user_model()


class CadauUserAdmin(RepliesStoppedFirst, UserAdmin):
    """Django's user admin, for users who own chats: a delete stops their replies first, their
    sessions go as a session's DELETE has them go (chat.services.sessions.user_sessions_delete,
    not the collector reading every message), and its confirmation counts, not lists."""

    def replies_stop(self, obj: Any) -> None:
        user_replies_stop(user_id=obj.pk)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        user_sessions_delete(user_id=obj.pk)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        user_ids = list(queryset.values_list("pk", flat=True))
        for user_id in user_ids:
            user_replies_stop(user_id=user_id)
        # One transaction, as Django's delete view has: no user left without their chats.
        with transaction.atomic():
            for user_id in user_ids:
                user_sessions_delete(user_id=user_id)
            super().delete_queryset(request, queryset)

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        users = list(objs)
        return deleted_objects(
            queryset=User.objects.filter(pk__in=[u.pk for u in users]),
            listed=[f"User: {u}" for u in users],
            request=request,
            admin_site=self.admin_site,
        )


if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, CadauUserAdmin)
