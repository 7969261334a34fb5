"""The fake server's `POST /v1/embeddings`: deterministic vectors whose cosine means something.

A text's vector is a hashed bag of its concepts: each word, lower-cased and without a plural
"s", counts in one of DIMENSIONS buckets (chosen by a hash of the word), unless CONCEPTS folds
it into a concept first ("cat", "dog", "pets" are all `animal`). So two texts are near when
they share words or concepts, and "What pets does she have?" is near "we got another cat"
while sharing no word with it: a test can tell semantic candidates from lexical ones. Stop
words count for nothing (else every question would be near every other).

Also the state tests drive (on FakeLLMServer): the inputs of every call (`embedding_inputs`),
failing the next calls (`embeddings_fail`), a delay (`embeddings_delay`), refusing long texts
(`embeddings_limit`), and llama-cpp-python's answer for a chat model (`embeddings_per_token`:
a vector per word, and wrong ones for every text of a batch after the first).
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

DIMENSIONS = 64

CONCEPTS: dict[str, str] = {
    **dict.fromkeys(("pet", "cat", "dog", "kitten", "puppy", "animal", "hamster"), "animal"),
    **dict.fromkeys(("job", "work", "career", "office", "employer", "profession"), "work"),
    **dict.fromkeys(("city", "town", "live", "moved", "home", "hometown"), "home"),
    **dict.fromkeys(("car", "bike", "bicycle", "vehicle", "drive", "ride"), "vehicle"),
    **dict.fromkeys(("paint", "painting", "art", "draw", "drawing", "sketch"), "art"),
}
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "got",
        "has",
        "have",
        "he",
        "her",
        "his",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
        "another",
    ]
)
_WORD = re.compile(r"\w+")


def _key(word: str) -> str:
    word = word.casefold()
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return CONCEPTS.get(word, word)


def text_vector(text: str, *, dimensions: int = DIMENSIONS) -> list[float]:
    """Unit length; all zeros for a text of stop words only."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text):
        if word.casefold() in STOP_WORDS:
            continue
        digest = hashlib.sha256(_key(word).encode()).digest()
        vector[int.from_bytes(digest[:4], "big") % dimensions] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def _token_vectors(text: str, *, dimensions: int, garbled: bool) -> list[list[float]]:
    """One vector per word (llama-cpp-python's answer for a model without pooling): their mean
    points where `text_vector` does. `garbled`: what that server returns for a text after the
    first of a batch, vectors unrelated to the text (here: those of its reversed words)."""
    words = [w for w in _WORD.findall(text) if w.casefold() not in STOP_WORDS] or ["_"]
    if garbled:
        words = [w[::-1] + "~" for w in words]
    return [text_vector(w, dimensions=dimensions) for w in words]


def embeddings_answer(
    body: dict[str, Any], *, per_token: bool = False
) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) for an embeddings request, as OpenAI answers it; `per_token`: as
    llama-cpp-python answers for a chat model (devtools/fakellm/server.py
    `embeddings_per_token`)."""
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return 400, {"error": {"message": "input must be a string or a list of strings"}}
    dimensions = body.get("dimensions") or DIMENSIONS
    if not isinstance(dimensions, int) or dimensions < 1:
        return 400, {"error": {"message": "dimensions must be a positive integer"}}
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _token_vectors(t, dimensions=dimensions, garbled=i > 0)
            if per_token
            else text_vector(t, dimensions=dimensions),
        }
        for i, t in enumerate(texts)
    ]
    tokens = sum(len(t.split()) for t in texts)
    return 200, {
        "object": "list",
        "data": data,
        "model": str(body.get("model") or "fake-embedding"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
