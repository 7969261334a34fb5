"""A fake OpenAI-compatible server: a real HTTP server on loopback for tests, benchmarks and
offline demos (`python manage.py fakellm`).

Endpoints: `POST /v1/chat/completions` (stream and non-stream, tool calls in the OpenAI delta
format), `POST /v1/embeddings` (deterministic vectors that fold synonyms: embeddings.py),
`GET /v1/models`, and a control API under `/_control/` mirroring the Python API, so a
test can drive a server living in another process.

Which calls are summaries: a request whose first system message contains `SUMMARY_MARKER`
("CADAU_SUMMARY_REQUEST") is a summary call. Summary calls take replies from the summary
script queue and, when it is empty, get a deterministic extractive digest of their input, no
longer than max_tokens x 4 runes nor than the prompt's "at most N characters".
Chat calls take from the chat queue, else get "Echo: <last user message>".

Faults (`fail_next`, FAULT_KINDS) are consumed before scripts: a call failed outright leaves
the script for the retry; a fault that changes the reply or strikes mid-stream (cut, hang after
K tokens, stream_error, length, no_usage, think_tags, reasoning) plays the script that way.

How the server behaves on every call is `configure()`: the failure shapes of real servers that
are properties of a server rather than of one call (a context window it reports and enforces,
one slot, no usage, rejecting `stream_options` or `tools`). docs/real-llm-notes.md says which
real server does what.

Every stream chunk carries `created` and `x_emit_ts` (the server's time.time() when the chunk
was written), so a client can measure the latency it adds on top of the model's.
"""

from chat.llm.base import SUMMARY_MARKER
from devtools.fakellm.scripts import (
    FAULT_KINDS,
    GARBAGE_TEXT,
    Call,
    Fault,
    ScriptedReply,
    tokenize,
)
from devtools.fakellm.server import FakeLLMServer

__all__ = [
    "FAULT_KINDS",
    "GARBAGE_TEXT",
    "SUMMARY_MARKER",
    "Call",
    "FakeLLMServer",
    "Fault",
    "ScriptedReply",
    "tokenize",
]
