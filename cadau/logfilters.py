"""Logging filters (cadau/settings.py LOGGING)."""

from __future__ import annotations

import logging


class RefusalAsWarning(logging.Filter):
    """A request Django refuses as suspicious (a Host this server does not serve: a scanner, a
    stale DNS name) is the client's doing, answered with a 400: one WARNING line, not an ERROR
    with a traceback that anyone can make the server write as often as they like. The line
    stays: an ALLOWED_HOSTS that misses the server's real name shows there."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


class ClientErrorWithoutTraceback(logging.Filter):
    """Django logs a refused request (a 403 of the admin for a staff member without the
    permission, a 400) at WARNING with the exception's whole traceback: many lines for an
    answer that is the client's doing, and anyone can make the server write them. The line
    stays; the traceback goes. A 5xx keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info, record.exc_text = None, None
        return True
