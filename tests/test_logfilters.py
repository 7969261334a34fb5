"""cadau/logfilters.py: a request for a host this server does not serve is one WARNING line."""

from __future__ import annotations

import logging

import pytest


@pytest.mark.django_db
def test_a_disallowed_host_is_a_400_and_one_warning_without_a_traceback(client, caplog):
    with caplog.at_level(logging.INFO):
        response = client.get("/api/v1/status", HTTP_HOST="evil.example")
    assert response.status_code == 400
    records = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert len(records) == 1
    assert records[0].levelname == "WARNING" and records[0].exc_info is None
    assert "evil.example" in records[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.django_db
def test_an_admin_403_is_one_warning_line_without_a_traceback(client, caplog):
    from tests.factories import UserFactory

    client.force_login(UserFactory(is_staff=True))  # staff, no permission on chat sessions
    with caplog.at_level(logging.INFO):
        response = client.get("/admin/chat/chatsession/")
    assert response.status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert len(records) == 1 and records[0].levelname == "WARNING"
    assert records[0].exc_info is None and records[0].exc_text is None


def test_a_server_error_keeps_its_traceback():
    from cadau.logfilters import ClientErrorWithoutTraceback

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord("django.request", logging.ERROR, "", 0, "x", (), sys.exc_info())
    record.status_code = 500
    assert ClientErrorWithoutTraceback().filter(record) and record.exc_info is not None
