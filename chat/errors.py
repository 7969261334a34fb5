"""Domain errors: what services and selectors raise when a request cannot be served.

Every error has a stable machine-readable `code` (the contract's `error.code`) and a message
meant for the user. The edges translate them: the REST API into `{"error": {...}}` with an HTTP
status (chat/api/errors.py), the WebSocket into an `error` event (chat/consumers.py). Nothing
below the edges knows about HTTP statuses or error-code strings of another layer."""

from __future__ import annotations

from django.http import Http404


class ChatError(Exception):
    """Base of every domain error. `code` is the contract's error code."""

    code = "bad_request"
    # Seconds after which the same request may succeed, when the refusal is a limit.
    retry_after: int | None = None

    def __init__(
        self, message: str, *, code: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if retry_after is not None:
            self.retry_after = retry_after

    @property
    def message(self) -> str:
        return str(self)


class NotFound(ChatError, Http404):
    """Missing, or someone else's: the two are indistinguishable on purpose (the ownership
    check, `session_for_user`). Also Django's Http404, so page views answer 404 as they are."""

    code = "not_found"

    def __init__(self, message: str = "Not found.", *, code: str | None = None) -> None:
        super().__init__(message, code=code)


class LoginEnded(ChatError):
    """The login a socket was opened with has ended (its password changed) and no message
    reached the socket to close it (another process changed it, with no shared channel
    layer): the send is refused and the socket closed, as that message would have."""

    code = "not_authenticated"

    def __init__(self, message: str = "Your login has ended; log in again.") -> None:
        super().__init__(message)


class InvalidInput(ChatError):
    code = "invalid"


class InvalidConfig(ChatError):
    """An agent's `config_json` (or one of its keys) is refused."""

    code = "invalid_config"


class MessageTooLarge(ChatError):
    code = "message_too_large"


class NotLastReply(ChatError):
    code = "not_last_reply"


class ReplyInProgress(ChatError):
    """Another reply of the session is generating (replies never interleave)."""

    code = "reply_in_progress"


class NothingToCancel(ChatError):
    code = "nothing_to_cancel"


class CancelFailed(ChatError):
    code = "cancel_failed"


class TooManyReplies(ChatError):
    """The user has as many replies generating, in all their sessions, as the server allows."""

    code = "too_many_replies"


class Throttled(ChatError):
    """More requests of a kind than the server's rate allows (cadau.limits)."""

    code = "throttled"


class CompactionInProgress(ChatError):
    code = "compaction_in_progress"


class CompactionFailed(ChatError):
    """A requested compaction could not make a usable summary; nothing changed."""

    code = "compaction_failed"


class SearchTimeout(ChatError):
    """A search ran past its time limit (chat/search): the query matched too much too sparsely;
    a narrower one (a session, a role, more characters) answers."""

    code = "search_timeout"
