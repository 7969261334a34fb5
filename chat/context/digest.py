"""The digest: the room a model's summary leaves under its cap, filled with the sentences the
extractive fallback keeps (chat/context/fallback.py), word for word.

A model may write a summary that passes every check and says little: "The two friends caught
up about their lives and plans." under the five headings, 300 runes of a 6,000-rune cap. What
it leaves out is then only where recall can find it, by the words of a question; a paraphrase
("What martial arts has John done?" for "I'm doing kickboxing") it cannot. The fallback's
sentences are chosen for what they carry (names, numbers, dates, places, first-person
statements), not for matching a question: on LoCoMo, the summary's room filled with them
holds more of the questions' evidence than the same room given to recall (docs/benchmarks.md,
"The room a short summary leaves").

Stored in the summary's own text, after DIGEST_SEPARATOR, so it needs no column and every
reader of the summary (the payload, its budget, the API) sees one text. The model is never
shown it: its request and the guard's checks take the summary without it
(`summary_split`), so the model's job, and what counts as its dropping an identifier, are what
they were. The digest is carried from round to round by the fallback's own rules (its
earlier bullets kept verbatim, the oldest facts last to go), and a sentence the model's
summary already says is not repeated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from chat.context.fallback import summary_extractive
from chat.context.heading import DIGEST_SEPARATOR
from chat.context.summarise import TranscriptMessage

logger = logging.getLogger("chat.context")

#: Below this much room a digest is not written: it would hold a fact or two, at the cost of
#: the separator's 50 runes besides (the fallback's own threshold for its empty headings).
DIGEST_MIN_RUNES = 600


def summary_split(summary: str) -> tuple[str, str]:
    """The model's summary and the digest stored after it ("" when there is none)."""
    own, separator, digest = summary.partition(DIGEST_SEPARATOR)
    return (own, digest) if separator else (summary, "")


def summary_with_digest(
    *, summary: str, digest: str, messages: Sequence[TranscriptMessage], cap: int
) -> str:
    """`summary` (the model's, accepted) and, in the room it leaves under `cap`, the digest of
    the previous `digest` and the `messages` just summarised, leaving out what `summary`
    already says; `summary` alone when that leaves nothing to keep."""
    room = cap - len(summary) - len(DIGEST_SEPARATOR)
    if room < DIGEST_MIN_RUNES:
        return summary
    # Only the sections that hold something: the five headings are the model's part's.
    kept = summary_extractive(
        previous=digest, messages=messages, max_runes=room, beside=summary, all_headings=False
    )
    if not kept:
        return summary
    logger.info("chat_summary_digest runes=%d room=%d", len(kept), room)
    return f"{summary}{DIGEST_SEPARATOR}{kept}"
