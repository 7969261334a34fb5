"""`python -m cadau.serve [Daphne's options] cadau.asgi:application`: Daphne, with the event
loop under its Twisted reactor from uvloop (when installed; it is a dependency off Windows).

Why: Daphne runs Twisted on an asyncio loop, and with 200 sockets streaming a token every 20 ms
the loop's own work (ready queue, selector, transports) was about a quarter of the server's
CPU; uvloop does it in C. Same Daphne, same options, same ASGI application.

Before serving, the crash sweep (`manage.py sweep_streaming`) runs once: replies a killed
process left `streaming` are failed and their sessions freed, whichever way the server was
started."""

import asyncio
import importlib.util
import logging
import os
import sys

if importlib.util.find_spec("uvloop") is not None:
    import uvloop

    # Before daphne.server is imported: it creates the loop Twisted runs on at import time.
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

# Only now (see above): this import creates the loop.
from daphne.cli import CommandLineInterface

logger = logging.getLogger("cadau.serve")


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


if __name__ == "__main__":
    if not {"-h", "--help"} & set(sys.argv[1:]):
        startup_sweep()
    CommandLineInterface.entrypoint()
