"""Text helpers for memory entries: tokenising (CJK-aware), normalising for dedup, slugs, and
the BM25 relevance score used by search and prompt injection."""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

# Runs of letters/digits in any script (\w minus underscore).
_WORD_RUN_RE = re.compile(r"[^\W_]+")
# Scripts written without spaces between words. A whole run of Chinese would otherwise be one
# "word" and never match a query, so each character is a token and adjacent pairs are too.
_CJK_RE = re.compile(
    "[\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs (ext A, unified, compatibility)
    "\uac00-\ud7af"  # Hangul syllables
    "\U00020000-\U0002ffff]"  # CJK ideographs ext B..
)


def tokens(text: str) -> list[str]:
    """Lower-cased (casefolded, NFKC) word tokens. Latin/Cyrillic/... runs are one token each;
    CJK characters are unigrams plus bigrams of adjacent CJK characters, so the query 喝茶
    matches 我喜欢喝茶 both character-wise and as a phrase (the bigram weighs phrase order)."""
    out: list[str] = []
    for run in _WORD_RUN_RE.findall(unicodedata.normalize("NFKC", text).casefold()):
        if not _CJK_RE.search(run):
            out.append(run)
            continue
        # Split the run into CJK characters and non-CJK stretches ("gpt4模型" -> gpt4, 模, 型).
        previous_cjk = ""
        buffer = ""
        for char in run:
            if _CJK_RE.fullmatch(char):
                if buffer:
                    out.append(buffer)
                    buffer = ""
                out.append(char)
                if previous_cjk:
                    out.append(previous_cjk + char)
                previous_cjk = char
            else:
                buffer += char
                previous_cjk = ""
        if buffer:
            out.append(buffer)
    return out


def normalized(text: str) -> str:
    """What two entries must share to be "the same fact": case, width, punctuation and
    whitespace differences do not count. Text without a letter or digit is its pictographs
    (Unicode's "other symbols": emoji, dingbats): an entry of emoji ("🥜🚫") says something,
    one of punctuation, spaces or ASCII signs ("+++", "~~~") nothing (""); the emoji's joiners,
    variation selectors and skin tones do not count."""
    words = tokens(text)
    if words:
        return " ".join(words)
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(c for c in folded if unicodedata.category(c) == "So")


def content_hash(text: str) -> str:
    return hashlib.sha256(normalized(text).encode("utf-8")).hexdigest()


def jaccard(a: str, b: str) -> float:
    set_a, set_b = set(tokens(a)), set(tokens(b))
    if not set_a or not set_b:
        return 0.0
    return len(set_a & set_b) / len(set_a | set_b)


_SLUG_WORD_RE = re.compile(r"[a-z0-9]+")
SLUG_MAX_CHARS = 60


def slugify_first_line(text: str) -> str:
    """An entry file name from the first non-empty line: ASCII words joined by '-', cut at a
    word boundary. Returns '' when the line has no ASCII words (e.g. Chinese); the caller then
    names the file from the content hash."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    ascii_text = unicodedata.normalize("NFKD", first).encode("ascii", "ignore").decode().lower()
    slug = ""
    for word in _SLUG_WORD_RE.findall(ascii_text):
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > SLUG_MAX_CHARS:
            break
        slug = candidate
    return slug


# In columns: a Chinese character takes two, as on screen.
TITLE_MAX_COLUMNS = 60
_TITLE_MARKS_RE = re.compile(r"^\s*(?:#{1,6}\s+|[-*+>]\s+)?")


def _columns(char: str) -> int:
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def entry_title(text: str) -> str:
    """What a person reads as an entry's name: its first non-empty line, in the words and
    script it was written in (a Chinese fact gets a Chinese title), without a heading's or a
    bullet's mark, cut near TITLE_MAX_COLUMNS. The file name stays the ASCII slug
    (paths.ENTRY_STEM_RE); this is only shown."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    title = " ".join(_TITLE_MARKS_RE.sub("", first, count=1).split())
    width, end = 0, len(title)
    for index, char in enumerate(title):
        width += _columns(char)
        if width > TITLE_MAX_COLUMNS:
            end = index
            break
    if end == len(title):
        return title
    cut = title[:end]
    # At a space when there is one in the last third (words); else anywhere (CJK has none).
    space = cut.rfind(" ")
    if space > len(cut) * 2 // 3:
        cut = cut[:space]
    return cut.rstrip(" ,.;:，。；：、") + "…"


BM25_K1 = 1.2
BM25_B = 0.75


def bm25_scores(*, query: str, documents: Sequence[str]) -> list[float]:
    """Okapi BM25 of `query` against each document, over `tokens()`:

        score(d) = sum over distinct query terms t of
                   idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))
        idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

    with k1=1.2, b=0.75, N the number of documents, df(t) how many contain t, |d| the token
    count of d. The "+1" inside the log keeps idf positive even for a term in every document,
    so a term that matches always helps. Documents sharing no query term score 0.
    """
    return Bm25Index([Counter(tokens(doc)) for doc in documents]).scores(query)


class Bm25Index:
    """`bm25_scores` with the documents' side done once: term counts, lengths and an inverted
    index, so scoring a query costs the postings of its terms, not a pass over every document
    (the memory cache keeps one per agent; agentmemory/index.py). Immutable once built."""

    def __init__(self, counted: Sequence[Counter[str]]) -> None:
        self.n_docs = len(counted)
        self.lengths = [sum(c.values()) for c in counted]
        self.avgdl = (sum(self.lengths) / self.n_docs) if self.n_docs else 1.0
        self.avgdl = self.avgdl or 1.0
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for index, counts in enumerate(counted):
            for term, tf in counts.items():
                self.postings.setdefault(term, []).append((index, tf))

    def scores(self, query: str) -> list[float]:
        scores = [0.0] * self.n_docs
        query_terms = set(tokens(query))
        if not query_terms or not self.n_docs:
            return scores
        # Terms in the same order for every document, as the one-pass formula adds them, so
        # the sums are bit-for-bit those of scoring each document on its own.
        for term in query_terms:
            postings = self.postings.get(term)
            if not postings:
                continue
            df = len(postings)
            idf = math.log(1 + (self.n_docs - df + 0.5) / (df + 0.5))
            for index, tf in postings:
                length = self.lengths[index]
                scores[index] += (
                    idf
                    * tf
                    * (BM25_K1 + 1)
                    / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / self.avgdl))
                )
        return scores
