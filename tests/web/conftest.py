"""Fixtures of the page tests."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.fixture
def web(owner) -> Client:
    """The owner's browser session (a logged-in test client)."""
    client = Client()
    client.force_login(owner)
    return client
