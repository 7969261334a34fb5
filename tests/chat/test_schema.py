import re

import pytest
from django.core.management import call_command


def test_openapi_schema_validates_without_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    for path in (
        "/api/v1/chat/sessions:",
        "/api/v1/chat/sessions/{session_id}:",
        "/api/v1/chat/sessions/{session_id}/context:",
        "/api/v1/chat/history:",
        "/api/v1/chat/history/turns:",
        "/api/v1/chat/truncate:",
        "/api/v1/auth/token:",
    ):
        assert path in text


@pytest.mark.django_db
def test_schema_endpoint_serves(api):
    response = api.get("/api/schema/")
    assert response.status_code == 200


@pytest.mark.django_db
def test_docs_use_local_sidecar_assets_only(api):
    response = api.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "drf_spectacular_sidecar" in html  # assets served by the app itself
    external = re.findall(r"""(?:src|href)=["'](https?:)?//""", html)
    assert external == []
    for cdn in ("cdn.jsdelivr", "unpkg.com", "cdnjs"):
        assert cdn not in html
