"""Replies as the chat page shows them (chat/rendering.py's Markdown), kept in this process.

A reply with code, a table and a formula takes milliseconds to render (Pygments, latex2mathml,
nh3): a history page of 25 such replies, ~50-90 ms of the chat opening. The same page is asked
for again and again (a reload, switching back to a chat, scrolling back over it), and a
finished reply never changes: each is rendered once per process.

Keyed by the message's id and its content (its length and hash, not the text: a collision
would need two versions of one message's text, and Python's string hash is seeded per
process), so a reply edited in the admin, or regenerated under the same id, is rendered anew.
Only finished replies are kept: a streaming one's text changes until it ends. Bounded by the
HTML it holds (CACHE_RUNES_MAX), least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from chat.rendering import render_markdown

# ~2 bytes a character at most for the HTML kept (ASCII 1): ~8-16 MB per process.
CACHE_RUNES_MAX = 8_000_000
# A reply's HTML over this is rendered every time: it would push out every other.
ENTRY_RUNES_MAX = CACHE_RUNES_MAX // 16

_lock = threading.Lock()
_kept: OrderedDict[tuple[int, int, int], str] = OrderedDict()
_kept_runes = 0


def reply_html(*, message_id: int, content: str, final: bool) -> str:
    """`content` rendered; from this process's cache when `final` (the reply has ended)."""
    if not final:
        return render_markdown(content)
    key = (message_id, len(content), hash(content))
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
            return found
    rendered = render_markdown(content)
    if len(rendered) <= ENTRY_RUNES_MAX:
        _keep(key, rendered)
    return rendered


def _keep(key: tuple[int, int, int], rendered: str) -> None:
    global _kept_runes
    with _lock:
        old = _kept.pop(key, None)
        if old is not None:
            _kept_runes -= len(old)
        _kept[key] = rendered
        _kept_runes += len(rendered)
        while _kept_runes > CACHE_RUNES_MAX:
            _, dropped = _kept.popitem(last=False)
            _kept_runes -= len(dropped)


def rendered_forget() -> None:
    """Drop every kept rendering (tests: ids come back after a rolled-back test on SQLite)."""
    global _kept_runes
    with _lock:
        _kept.clear()
        _kept_runes = 0
