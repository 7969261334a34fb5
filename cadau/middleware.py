"""A middleware Django can run in either mode.

Under ASGI a sync-only middleware turns the whole chain above it sync: every request crossed
from the event loop to a thread and back once more for it. Our own middleware therefore runs
in both modes; cadau/asgihandler.py uses the sync chain for sync views and the async chain
for async ones."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase


class BothModesMiddleware:
    """Subclasses write `call` (the chain is sync) and `acall` (the chain is async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.acall(request)
        return self.call(request)

    def call(self, request: HttpRequest) -> HttpResponseBase:
        raise NotImplementedError

    def acall(self, request: HttpRequest) -> Awaitable[HttpResponseBase]:
        raise NotImplementedError
