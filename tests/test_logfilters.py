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
