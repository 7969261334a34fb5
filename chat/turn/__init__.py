"""The turn service: one owner for a turn, whichever adapter it comes through.

    adapters (chat/api/send.py, chat/consumers.py)
      -> service:   turn_send / turn_open / turn_regenerate hand back a TurnRun, which the
                    adapter renders: run.result() (JSON), run.events() (SSE), run.start()
                    and run.own (a socket)
      -> follow:    a repeat's view of a reply already running, here or in another process
      -> checks:    a send's checks, in one order for every adapter
      -> rows:      storing a turn (the user message and its reply row)
      -> replies:   the reply row's life (progress, finish, fail, cancel, restart, sweep)
      -> generate:  one reply: prepare the context, run the rounds, finish, after-reply work
         -> toolloop (+ checkpoint): the model rounds and the agent's tool calls
         -> stream:   one model call, streamed, its progress saved
      -> registry:  the replies running in this process, and how their events leave
      -> lease:     this process's liveness, and the sweep of a dead process's replies
      -> chat.context (payload, compaction), chat.llm, chat.hooks (memory), chat.events

Nothing here calls back up: the registry knows no generation, the generation no adapter.
"""

from chat.turn.generate import ReplyResult
from chat.turn.lease import reaper_ensure
from chat.turn.registry import reply_cancel, reply_ends, reply_resume, reply_watch
from chat.turn.replies import streaming_sweep
from chat.turn.rows import Turn
from chat.turn.service import TurnResult, TurnRun, turn_open, turn_regenerate, turn_send
from chat.turn.truncate import (
    session_delete_live,
    session_replies_stop,
    turn_session_delete,
    user_replies_stop,
)

__all__ = [
    "ReplyResult",
    "Turn",
    "TurnResult",
    "TurnRun",
    "reaper_ensure",
    "reply_cancel",
    "reply_ends",
    "reply_resume",
    "reply_watch",
    "session_delete_live",
    "session_replies_stop",
    "streaming_sweep",
    "turn_open",
    "turn_regenerate",
    "turn_send",
    "turn_session_delete",
    "user_replies_stop",
]
