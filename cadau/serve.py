"""`python -m cadau.serve [Daphne's options] cadau.asgi:application`: Daphne, with the event
loop under its Twisted reactor from uvloop (when installed; it is a dependency off Windows),
WebSocket limits that let the app's own ones speak, and refusals of oversized requests in the
API's JSON error shape.

Why uvloop: Daphne runs Twisted on an asyncio loop, and with 200 sockets streaming a token every
20 ms the loop's own work (ready queue, selector, transports) was about a quarter of the
server's CPU; uvloop does it in C. Same Daphne, same options, same ASGI application.

Before serving, the crash sweep (`manage.py sweep_streaming`) runs once: replies a killed
process left `streaming` are failed and their sessions freed, whichever way the server was
started."""

import asyncio
import importlib.util
import json
import logging
import os
import sys
from typing import Any

if importlib.util.find_spec("uvloop") is not None:
    import uvloop

    # Before daphne.server is imported: it creates the loop Twisted runs on at import time.
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

# Only now (see above): this import creates the loop.
from daphne import http_protocol
from daphne import server as daphne_server
from daphne.cli import CommandLineInterface
from twisted.web import http as twisted_http

# What Daphne takes of a WebSocket message above WS_MAX_FRAME_BYTES. Its own default (1 MiB)
# cut frames the app allows (2.5 MiB) and those just over: both were dropped with a bare close
# 1009. With the margin the app reads a frame over its cap and answers `bad_request`, the
# socket staying open; only a frame over cap + margin is Daphne's to refuse.
WS_LIMIT_MARGIN = 1024 * 1024


def websocket_limit() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    from django.conf import settings

    return int(settings.WS_MAX_FRAME_BYTES) + WS_LIMIT_MARGIN


def body_limit() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    from django.conf import settings

    return int(settings.HTTP_MAX_BODY_BYTES)


class JsonRefusalsChannel(twisted_http.HTTPChannel):
    """Twisted's HTTP channel, answering what it refuses before the app sees a request in the
    API's error shape. It reads a request line and each header line up to 16 KiB, and all of
    them together up to 16 KiB; past that it closed the connection without a word (a long
    query string got an empty reply) or wrote a bare 400."""

    # HTTP_MAX_BODY_BYTES, set by main().
    max_body_bytes: int | None = None

    def allHeadersReceived(self) -> None:
        # Twisted reads a request's whole body before Daphne hands the request on, so a body
        # announced over the cap is refused here, unread (cadau/bodylimit.py refuses one that
        # turns out larger as it streams in). Before, 200 MB were read for a 413, and a length
        # no client would send was waited for until the connection timed out, unanswered.
        limit = self.max_body_bytes
        if limit is not None and self.length is not None and self.length > limit:
            self._refuse_body(limit)
            return
        decoder = getattr(self, "_transferDecoder", None)
        if limit is not None and self.length is None and decoder is not None:
            # A chunked body: counted as it arrives, refused as soon as it is over.
            handle = decoder.dataCallback
            received = 0

            def counted(data: bytes) -> None:
                nonlocal received
                received += len(data)
                if received > limit:
                    if not self._refused:
                        self._refuse_body(limit)
                    return
                handle(data)

            decoder.dataCallback = counted
        super().allHeadersReceived()

    _refused = False

    def _refuse_body(self, limit: int) -> None:
        self._refused = True
        message = f"The request body is over the limit of {limit} bytes."
        body = {"error": {"code": "request_too_large", "message": message}}
        self._write_refusal(413, b"Content Too Large", body)

    def lineLengthExceeded(self, line: bytes) -> None:
        if self._reading_request_line():
            self._refuse(414, b"URI Too Long", "uri_too_long", "The request line")
        else:
            self._refuse(431, b"Request Header Fields Too Large", "headers_too_large", "A header")

    def _respondToBadRequestAndDisconnect(self) -> None:
        if self._receivedHeaderSize > self.totalHeadersSize:
            self._refuse(
                431,
                b"Request Header Fields Too Large",
                "headers_too_large",
                "The request line and headers together",
            )
        else:
            body = {"error": {"code": "bad_request", "message": "The request is not valid HTTP."}}
            self._write_refusal(400, b"Bad Request", body)

    def _reading_request_line(self) -> bool:
        # Twisted's own flag (name-mangled): set until a request's first line is parsed.
        return bool(getattr(self, "_HTTPChannel__first_line", 1))

    def _refuse(self, status: int, reason: bytes, code: str, what: str) -> None:
        message = f"{what} is over the server's limit of {self.MAX_LENGTH} bytes."
        self._write_refusal(status, reason, {"error": {"code": code, "message": message}})

    def _write_refusal(self, status: int, reason: bytes, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        head = (
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, reason, len(data))
        )
        transport: Any = self.transport
        transport.write(head + data)
        self._log_refusal(status, len(head) + len(data))
        # Half-close, then read and drop the rest: closing with unread bytes would answer them
        # with a reset, which can reach the client before the refusal does.
        for name in ("dataReceived", "lineReceived", "rawDataReceived"):
            setattr(self, name, _discard)
        transport.loseWriteConnection()
        self.setTimeout(5)

    def _log_refusal(self, status: int, size: int) -> None:
        # Into Daphne's access log with every other answer: a refusal made here never reaches
        # Daphne's request, which is what writes the line, and an operator watching for
        # oversized requests saw nothing. Method and path once the request line was parsed.
        server = getattr(getattr(self, "factory", None), "server", None)
        if server is None:
            return
        transport: Any = self.transport
        peer: Any = transport.getPeer() if transport is not None else None
        path = getattr(self, "_path", b"-")
        server.log_action(
            "http",
            "complete",
            {
                "path": path.decode("ascii", "replace")[:2048],
                "status": status,
                "method": getattr(self, "_command", b"-").decode("ascii", "replace")[:16],
                "client": f"{peer.host}:{peer.port}" if hasattr(peer, "host") else None,
                "time_taken": 0.0,
                "size": size,
            },
        )


def _discard(*_args: Any) -> None:
    return None


def _channel(factory: Any) -> Any:
    # As twisted.web.http._genericHTTPChannelProtocolFactory, with our channel (HTTP/2 is
    # still negotiated by the wrapper when TLS offers it).
    return twisted_http._GenericHTTPChannelProtocol(JsonRefusalsChannel())


logger = logging.getLogger("cadau.serve")


def startup_checks() -> list[str]:
    """Django's system checks at ERROR and above, as lines to print: a setting that names code
    (AGENT_TOOLS, AGENT_MEMORY_STORAGE) is checked here, not at its first use. `make run`
    runs them through `migrate`; a deployment may start this module without it."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup(set_prefix=False)
    from django.core import checks

    # SILENCED_SYSTEM_CHECKS as Django's own commands honour it.
    found = checks.run_checks()
    return [str(m) for m in found if m.level >= checks.ERROR and not m.is_silenced()]


def startup_sweep() -> int:
    """Fail the replies dead processes left `streaming` (chat.turn.streaming_sweep). A
    database that does not answer yet does not keep the server from starting: the sweep of
    the processes' sockets and the next send on each session do the same later."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup(set_prefix=False)
    from django.db import connections

    from chat.turn import streaming_sweep

    try:
        swept = streaming_sweep()
    except Exception:
        logger.exception("cadau_startup_sweep_failed")
        return 0
    finally:
        connections.close_all()
    logger.info("cadau_startup_sweep replies_failed=%d", swept)
    return swept


class ClosingWebSocketFactory(daphne_server.WebSocketFactory):
    """Daphne's, failing a connection with a closing handshake, not a dropped TCP connection:
    Autobahn's default dropped it at once for a message over the size limit, and the reset
    reached the client before (or instead of) the close frame, so it saw 1006, not 1009."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setProtocolOptions(failByDrop=False)


def main(argv: list[str]) -> None:
    http_protocol.HTTPFactory.protocol = _channel
    daphne_server.WebSocketFactory = ClosingWebSocketFactory
    JsonRefusalsChannel.max_body_bytes = body_limit()
    cli = CommandLineInterface()
    limit = websocket_limit()
    # Defaults only: --websocket-max-message-size / --websocket-max-frame-size still win.
    cli.parser.set_defaults(websocket_max_message_size=limit, websocket_max_frame_size=limit)
    cli.run(argv)


if __name__ == "__main__":
    if not {"-h", "--help"} & set(sys.argv[1:]):
        if errors := startup_checks():
            print(
                "Cadau does not start: the system checks failed.",
                *errors,
                sep="\n",
                file=sys.stderr,
            )
            sys.exit(1)
        startup_sweep()
        from chat.search.concepts import concepts_load

        concepts_load()  # before the first question asking for a kind, not during it
    main(sys.argv[1:])
