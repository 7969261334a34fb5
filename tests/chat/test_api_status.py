import pytest

pytestmark = pytest.mark.django_db


def test_status_names_the_offline_provider(api, settings):
    from chat.llm import reset_provider

    settings.LLM_BASE_URL = ""
    reset_provider()
    body = api.get("/api/v1/status").json()
    assert body["user"]["username"] == "owner"
    assert body["provider"]["offline"] is True
    assert body["context"]["strategy"] == "cadau"


def test_status_names_the_configured_provider_without_the_key(api, fake_llm):
    body = api.get("/api/v1/status").json()
    assert body["provider"]["offline"] is False
    assert body["provider"]["model"] == "fake-chat"
    assert "test-key" not in str(body)


def test_status_needs_a_login(anon_api):
    r = anon_api.get("/api/v1/status")
    assert r.status_code in (401, 403) and "error" in r.json()
