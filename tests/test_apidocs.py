"""cadau/apidocs.py: the schema and the Swagger UI are for logged-in users unless
API_DOCS_PUBLIC=true. Before it, both answered anonymous callers 200."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.test_settings import _settings_in_child

pytestmark = pytest.mark.django_db

DOCS = ["/api/schema/", "/api/schema/?format=json", "/api/docs/"]


@pytest.mark.parametrize("path", DOCS)
def test_anonymous_callers_get_the_api_403(path):
    response = APIClient().get(path)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_authenticated"


@pytest.mark.parametrize("path", DOCS)
def test_logged_in_users_and_tokens_read_them(api, owner, path):
    assert api.get(path).status_code == 200
    browser = APIClient()
    browser.force_login(owner)
    assert browser.get(path).status_code == 200


@pytest.mark.parametrize("path", DOCS)
def test_api_docs_public_opens_them(settings, path):
    settings.API_DOCS_PUBLIC = True
    assert APIClient().get(path).status_code == 200


def test_the_setting_is_a_strict_bool_off_by_default():
    assert _settings_in_child({}, "s.API_DOCS_PUBLIC").stdout.split() == ["False"]
    assert _settings_in_child({"API_DOCS_PUBLIC": "yes"}, "s.API_DOCS_PUBLIC").stdout.split() == [
        "True"
    ]
    done = _settings_in_child({"API_DOCS_PUBLIC": "maybe"}, "s.API_DOCS_PUBLIC")
    assert done.returncode != 0 and "ImproperlyConfigured: API_DOCS_PUBLIC" in done.stderr
