"""`python -m cadau.serve [Daphne's options] cadau.asgi:application`: Daphne, with the event
loop under its Twisted reactor from uvloop (when installed; it is a dependency off Windows).

Why: Daphne runs Twisted on an asyncio loop, and with 200 sockets streaming a token every 20 ms
the loop's own work (ready queue, selector, transports) was about a quarter of the server's
CPU; uvloop does it in C. Same Daphne, same options, same ASGI application."""

import asyncio
import importlib.util

if importlib.util.find_spec("uvloop") is not None:
    import uvloop

    # Before daphne.server is imported: it creates the loop Twisted runs on at import time.
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

# Only now (see above): this import creates the loop.
from daphne.cli import CommandLineInterface

if __name__ == "__main__":
    CommandLineInterface.entrypoint()
