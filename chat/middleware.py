"""Content-Security-Policy on every HTML response.

The chat page renders model output, so the last line of defence against an XSS that slipped
through sanitising is a policy under which injected markup cannot run: scripts and styles only
from our own origin (no 'unsafe-inline', so no inline <script>, on*= handler or style=
attribute executes), no framing, no <base> or form hijacking. Templates therefore carry no
inline script or style at all; data reaches the JS through data-* attributes and
<script type="application/json"> blocks, which are never executed."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'; object-src 'none'"
)

# drf-spectacular's Swagger page boots from an inline <script> and <style>; it is a developer
# tool that never shows chat content, so it keeps working without the policy.
EXEMPT_PREFIXES = ("/api/docs/",)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        content_type = response.get("Content-Type", "")
        # JSON and event streams are not documents a browser renders; HTML gets the policy.
        if (
            content_type.startswith("text/html")
            and "Content-Security-Policy" not in response
            and not request.path.startswith(EXEMPT_PREFIXES)
        ):
            response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        return response
