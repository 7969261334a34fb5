"""Every string the chat page's JavaScript shows, translated on the server.

The page embeds this catalog as JSON (never executed, so the CSP allows it) and the JS looks
strings up by key: one translation workflow (makemessages / .po) for templates and scripts, and
no JavaScriptCatalog round trip before the first render."""

from __future__ import annotations

from django.utils.translation import gettext as _


def js_strings() -> dict[str, str]:
    return {
        **_message_strings(),
        **_reply_strings(),
        **_compaction_strings(),
        **_empty_strings(),
        **_search_strings(),
        **_agents_strings(),
        **_state_strings(),
        **_dialog_strings(),
        **_code_strings(),
    }


def _message_strings() -> dict[str, str]:
    """Roles, a message's actions and their confirmations, a chat's title."""
    return {
        "you": _("You"),
        "assistant": _("Assistant"),
        "tool": _("Tool"),
        "system": _("System"),
        "copy": _("Copy"),
        "copied": _("Copied"),
        "edit": _("Edit"),
        "edit_send": _("Save and send"),
        "cancel": _("Cancel"),
        "regenerate": _("Regenerate"),
        "retry": _("Retry"),
        "remember": _("Remember"),
        "remembered": _("Saved to memory"),
        "rename": _("Rename"),
        "delete": _("Delete"),
        "rename_prompt": _("New title"),
        "untitled": _("New chat"),
    }


def _reply_strings() -> dict[str, str]:
    """A reply's state, loading and sending, the connection."""
    return {
        "status_failed": _("The reply failed."),
        "status_cancelled": _("The reply was stopped."),
        "reply_cut_length": _("The reply was cut off at the model's length limit."),
        "reply_cut_interrupted": _("The reply ended before the model finished it."),
        "continue": _("Continue"),
        "continue_prompt": _("Please continue where you stopped."),
        "streaming": _("Generating…"),
        "new_messages": _("New messages ↓"),
        "loading": _("Loading…"),
        "load_error": _("Could not load messages. Scroll to retry."),
        "send_error": _("Could not send the message."),
        "network_error": _("The server could not be reached; try again."),
        "reconnecting": _("Connection lost; reconnecting…"),
    }


def _compaction_strings() -> dict[str, str]:
    """Compaction notices, the compaction history and the context ring."""
    return {
        "compaction_started": _("Compacting older turns into the summary…"),
        "compaction_done": _("Older turns were compacted into the summary."),
        "compaction_failed": _("Compaction failed; nothing was lost, it will be retried."),
        "compaction_noop": _("Nothing to compact yet."),
        "compaction_skipped": _("Nothing was compacted: the recent turns must stay word for word."),
        "compaction_busy": _("Nothing was compacted: another compaction of this chat is running."),
        "compaction_conflict": _(
            "Nothing was compacted: the chat changed meanwhile; it will be retried."
        ),
        "history": _("Compaction history"),
        "summary_in_force": _("Summary the model sees now"),
        "summary_none": _("No summary yet: the model sees every message word for word."),
        "verbatim_since": _("Word for word from message #%(id)s on."),
        "history_empty": _("No compactions yet."),
        "history_summary": _("The summary at that point"),
        "history_older": _("Older entries"),
        "history_range": _("Messages #%(from)s–#%(to)s"),
        "history_rolled": _("%(n)s messages folded in"),
        "outcome_committed": _("Compacted"),
        "outcome_failed": _("Failed"),
        "outcome_rejected": _("Summary rejected"),
        "outcome_conflict": _("Conflict, nothing changed"),
        "outcome_reset": _("Summary reset"),
        "outcome_rewound": _("Rewound by an edit"),
        "ring_title": _("Context: %(used)s of %(limit)s characters (%(pct)s%%)"),
    }


def _empty_strings() -> dict[str, str]:
    """Empty lists and the error prefix."""
    return {
        "no_turns": _("No questions yet."),
        "no_sessions": _("No chats yet."),
        "empty_chat": _("Send a message to start."),
        "memory_empty": _("No long-term memories yet."),
        "no_agent": _("No agent"),
        "error_prefix": _("Error:"),
    }


def _search_strings() -> dict[str, str]:
    """Message search (static/chat/search.js)."""
    return {
        "search_searching": _("Searching…"),
        "search_none": _("No messages found."),
        "search_none_yet": _("No matches in the messages searched so far."),
        "search_throttled": _("Too many searches; wait a moment and type again."),
        "search_throttled_in": _("Too many searches; try again in %(seconds)s s."),
        "search_timeout": _("The search took too long; try a longer or more specific query."),
        "search_hit_gone": _("That message could not be shown; it may have been deleted."),
    }


def _agents_strings() -> dict[str, str]:
    """The agents page (static/chat/agents.js)."""
    return {
        "my_agents": _("My agents"),
        "new_agent": _("New agent"),
        "no_agents": _("No agents yet."),
        "default_model": _("Server default (%(model)s)"),
        "no_tools": _("This server offers no tools."),
        "name_required": _("An agent needs a name."),
        "agent_saved": _("Agent saved."),
        "confirm_delete_agent": _(
            "Delete the agent %(name)s? Its chats stay, without an agent; its memory files "
            "are kept on the server."
        ),
        "days_with_notes": _("Days with notes (%(count)s)"),
        "no_note": _("No note for this day."),
        "save": _("Save"),
        "no_matches": _("Nothing in memory matches."),
        "entry_saved": _("Memory saved."),
        "confirm_delete_entry": _("Delete this memory? This cannot be undone."),
    }


def _state_strings() -> dict[str, str]:
    """A reply on its way, tool rounds, memory, long messages, the way back to the newest."""
    return {
        "pending_reply": _("The assistant is preparing a reply…"),
        "stopping": _("Stopping…"),
        "tools_running": _("Running %(names)s…"),
        "tool_named": _("Tool · %(name)s"),
        "memory_updated": _("Memory updated"),
        "memory_failed": _("Could not save to memory:"),
        "show_more": _("Show more"),
        "show_less": _("Show less"),
        "jump_latest": _("Jump to latest"),
        "ring_now": _(
            "The model is sent %(used)s of the %(limit)s characters it can take for this chat "
            "(%(pct)s%%): the summary of older turns, the newest turns word for word, and "
            "your next message."
        ),
        "ring_auto": _(
            "At %(threshold)s%% the older turns are compacted into the summary by themselves."
        ),
        "ring_hint": _("Click for what it means and for Compact now."),
        "ring_full": _(
            "Past %(threshold)s%%: the next reply first compacts the older turns into the "
            "summary, or press Compact now."
        ),
    }


def _dialog_strings() -> dict[str, str]:
    """The page's dialogs: rename, delete (with undo), edit and resend."""
    return {
        "rename_title": _("Rename chat"),
        "delete_title": _("Delete “%(title)s”?"),
        "confirm_delete_undo": _(
            "The chat and all its messages are deleted. You can undo it for a few seconds."
        ),
        "chat_deleted": _("“%(title)s” deleted."),
        "edit_title": _("Edit and resend?"),
        "edit_confirm": _("Delete and send"),
        "edit_deletes_none": _("This message is deleted and the new text is sent in its place."),
        "edit_deletes_one": _(
            "This message and the 1 message after it are deleted, then the new text is sent."
        ),
        "edit_deletes_many": _(
            "This message and the %(n)s messages after it are deleted, then the new text is sent."
        ),
        "edit_deletes_at_least": _(
            "This message and at least %(n)s messages after it are deleted, then the new text "
            "is sent."
        ),
        "edit_rewinds": _("The conversation summary also goes back to an earlier state."),
    }


def _code_strings() -> dict[str, str]:
    """A code block's label, its Copy button's name and its scroll region's name; the chat's
    model picker."""
    return {
        "code_plain": _("text"),
        "code_copy": _("Copy code (%(language)s)"),
        "code_region": _("Code: %(language)s"),
        "math_region": _("Formula"),
        "model_default": _("Default (%(model)s)"),
        "model_set": _("Replies in this chat now come from %(model)s."),
    }
