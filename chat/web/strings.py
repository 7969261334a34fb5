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
        "confirm_delete": _("Delete this chat and all its messages? This cannot be undone."),
        "confirm_edit": _(
            "Editing deletes this message and everything after it, then sends the new text."
        ),
        "confirm_rewind": _(
            "This also rewinds the conversation summary to an earlier state. Continue?"
        ),
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
