"""Content-Security-Policy on every HTML response; static files; sends and regenerates on their
way to their first token, from the moment they arrive.

The chat page renders model output, so the last line of defence against an XSS that slipped
through sanitising is a policy under which injected markup cannot run: scripts and styles only
from our own origin (no 'unsafe-inline', so no inline <script>, on*= handler or style=
attribute executes), no framing, no <base> or form hijacking. Templates therefore carry no
inline script or style at all; data reaches the JS through data-* attributes and
<script type="application/json"> blocks, which are never executed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve

from cadau.compression import CompressingWhiteNoise
from cadau.middleware import BothModesMiddleware
from chat.workers import foreground_enter, foreground_exit

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'; object-src 'none'"
)
# connect-src 'self' covers the page's own WebSocket: CSP Level 3 lets 'self' match ws: and wss:
# URLs of the page's host and port (Chromium, Firefox and Safari implement it; the browser test
# tests/browser/test_csp_socket.py proves it for Chromium). `ws: wss:` would let injected script
# open a socket to any host.

# drf-spectacular's Swagger page boots from an inline <script> and <style>; it is a developer
# tool that never shows chat content, so it keeps working without the policy.
EXEMPT_PREFIXES = ("/api/docs/",)


def _with_policy(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    content_type = response.get("Content-Type", "")
    # JSON and event streams are not documents a browser renders; HTML gets the policy.
    if (
        content_type.startswith("text/html")
        and "Content-Security-Policy" not in response
        and not request.path.startswith(EXEMPT_PREFIXES)
    ):
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


class ContentSecurityPolicyMiddleware(BothModesMiddleware):
    def call(self, request: HttpRequest) -> HttpResponseBase:
        return _with_policy(request, self.get_response(request))

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        return _with_policy(request, await self.get_response(request))


class StaticFilesMiddleware(BothModesMiddleware):
    """WhiteNoise, in both modes. WhiteNoise's middleware is sync only, which made the whole
    chain above it sync under ASGI: every request (a send's first token included) crossed
    from the event loop to a thread, back to the loop for the rest of the chain, and to a
    thread again for the view. Here only a request for a static file leaves the loop."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)
        # Serves each file's cached Brotli/gzip copy to a browser that takes it.
        self.whitenoise = CompressingWhiteNoise(get_response)

    def _static_file(self, request: HttpRequest) -> Any:
        if self.whitenoise.autorefresh:
            return self.whitenoise.find_file(request.path_info)
        return self.whitenoise.files.get(request.path_info)

    def call(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = self.whitenoise(request)
        return response

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(self._prefix):
            static_file = await sync_to_async(self._static_file)(request)
            if static_file is not None:
                return self.whitenoise.serve(static_file, request)
        return await self.get_response(request)

    @property
    def _prefix(self) -> str:
        return "/" + settings.STATIC_URL.lstrip("/")


class TurnForegroundMiddleware(BothModesMiddleware):
    """A send or a regenerate is on its way to its first token from the moment it reaches the
    middleware chain: this process's background work gives way to it (chat/workers.py) while
    DRF authenticates, throttles and parses it too. The turn service holds it from its checks
    to the reply's first token; this covers what comes before. Requests not yet authenticated
    count too: what they can delay a background job by is bounded (YIELD_JOB_SECONDS).
    Measured (bench ttft, a REST send while an import's first compaction ran, three runs):
    28-34 ms added on PostgreSQL with the turn service's hold alone, 23-28 with this one too;
    on SQLite 24-30 against 20-33, within the runs' noise."""

    _ROUTES = frozenset(("chat-send", "chat-regenerate"))

    def _is_turn(self, request: HttpRequest) -> bool:
        if request.method != "POST":
            return False
        try:
            # By name, on path_info: a reversed path carries the script prefix (a root path).
            return resolve(request.path_info).url_name in self._ROUTES
        except Resolver404:
            return False

    def call(self, request: HttpRequest) -> HttpResponseBase:
        if not self._is_turn(request):
            return self.get_response(request)
        key = foreground_enter()
        try:
            return self.get_response(request)
        finally:
            foreground_exit(key)

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        if not self._is_turn(request):
            return await self.get_response(request)
        key = foreground_enter()
        try:
            return await self.get_response(request)
        finally:
            foreground_exit(key)
