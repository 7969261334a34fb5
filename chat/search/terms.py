"""The words of a user's message that recall searches for (chat/search/recall.py).

Without embeddings, recall finds an archived turn by the message's most distinctive words.
Two kinds of script, two ways of cutting them:

- scripts that separate words (Latin, Cyrillic, Greek, Hangul, kana...): Unicode words, with the
  characters identifiers are made of kept inside them (`ERR-7731`, `db.example.org`,
  `Türcode`); words under three characters and filler words are skipped;
- Chinese, which does not: each run of Han characters is cut at its function characters
  (的, 是, 吗...). A two-character piece (密码, 端口, 生日: most Chinese words) is a term as it
  is, searched through the bounded window scan (no trigram to look up, docs/search.md); a longer
  piece gives its three-character runs, searched through the trigram index.

Pure functions on strings: no I/O.
"""

from __future__ import annotations

import re

TERMS_MAX = 6
# A term is a substring of the message it finds, so a prefix finds the same message. Without a
# cap a 200k-character token became one 33k-character term, and the search of it held the
# send's first token for seconds.
TERM_MAX_CHARS = 64

# Han ideographs (CJK unified, extension A, compatibility), as chat/context/heading.py.
_HAN_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_RUN = re.compile(f"[{_HAN_CLASS}]+")
# A word character of any script but Han (`\w` is Unicode-aware on str patterns: ü, д, 한).
_WORD_CHAR = f"[^\\W{_HAN_CLASS}]"
# Identifier punctuation joins word characters into one term (never at either end).
_WORD = re.compile(f"{_WORD_CHAR}(?:(?:{_WORD_CHAR}|[.:/#@-])*{_WORD_CHAR})?")
_IDENTIFIER = re.compile(r"[\d_.:/#@-]")

_STOPWORD_TEXT = (
    "the and for you are was were not but can all any had has have his her our out who how "
    "why what which when where that this these those with from your about there their would "
    "could should been they them then than into does did tell remember said earlier before "
    "again please know just like also some more most very will shall may might must its "
    "let give get got want need thing things told say says conversation chat message messages "
    # Replies that carry no topic: alone, they must recall nothing ("yes" is in "yesterday").
    "yes yeah yep nope okay sure thanks thank hello hey sorry great good nice cool fine right "
    "well hmm"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# Chinese function characters: the places a run of Han characters is cut into words.
_HAN_STOP = frozenset("的了是我你他她它们吗呢吧啊什么多少在有和与这那个就也都要说过还请问哪谁怎")
# Two-character pieces that carry no topic (thanks, can, know, now, because...).
_HAN_STOPWORD_TEXT = (
    "谢谢 可以 知道 现在 然后 因为 所以 但是 如果 没有 一下 之前 以前 记得 告诉 时候 上次 "
    "刚才 当时 好吧 对吧 一些 东西 事情 应该 需要 觉得"
)
_HAN_STOPWORDS = frozenset(_HAN_STOPWORD_TEXT.split())
# Runs looked at before giving up on finding TERMS_MAX distinct ones.
_HAN_EXAMINED_MAX = 4096
_HAN_SPLIT = re.compile("[" + "".join(sorted(_HAN_STOP)) + "]+")


def stopword(word: str) -> bool:
    """A filler word ("the", "what", "thanks"): never a term."""
    return word.casefold() in _STOPWORDS


def term_is_identifier(term: str) -> bool:
    """Digits, dashes, dots...: an identifier is rarer than a word, and weighs more."""
    return bool(_IDENTIFIER.search(term))


def recall_terms(text: str, *, most: int = TERMS_MAX) -> list[str]:
    """The words of `text` worth searching for, most distinctive first: identifiers (digits,
    dashes, dots), then longer words, then Chinese words (two characters) and three-character
    runs, at most `most` of them, each at most TERM_MAX_CHARS."""
    words: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group(0)
        if len(word) < 3 or word.casefold() in _STOPWORDS:
            continue
        words.append(word[:TERM_MAX_CHARS])
    words.sort(key=lambda w: (not term_is_identifier(w), -len(w)))
    terms: list[str] = []
    seen: set[str] = set()
    for term in [*words, *_han_terms(text, most=most)]:
        key = term.casefold()
        if key not in seen:
            seen.add(key)
            terms.append(term)
            if len(terms) == most:
                break
    return terms


# English inflections: the index matches substrings, so a stem finds every form of the word.
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ed", "es", "s", "ly")
_LATIN_WORD = re.compile(r"[a-z]+")


def term_stem(term: str) -> str:
    """`term` without an English inflection when one leaves a stem of four letters or more
    ("painting", "painted" -> "paint"); anything else (identifiers, other scripts) as it is."""
    word = term.casefold()
    if not _LATIN_WORD.fullmatch(word):
        return term
    for suffix in _SUFFIXES:
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 4:
            # "themes" is not about "them": a stem that is a filler word is no term.
            return term if stem in _STOPWORDS else stem
    return term


def _han_terms(text: str, *, most: int = TERMS_MAX) -> list[str]:
    """Chinese terms, taken round-robin across the pieces (the first run of each piece, then the
    second...) so that one long piece does not crowd out the other words of the message."""
    pieces = [
        piece
        for run in _HAN_RUN.findall(text)
        for piece in _HAN_SPLIT.split(run)
        if len(piece) >= 2 and piece not in _HAN_STOPWORDS
    ]
    terms: list[str] = []
    seen: set[str] = set()
    offset = examined = 0
    # Each round takes one run of every piece still long enough, and drops the pieces it used
    # up. It stops once enough distinct terms are found, or after _HAN_EXAMINED_MAX runs (a
    # long message repeating itself would otherwise be walked to its end).
    while pieces and len(terms) < most and examined < _HAN_EXAMINED_MAX:
        for piece in pieces:
            examined += 1
            term = piece[offset : offset + 3]
            if term not in seen:
                seen.add(term)
                terms.append(term)
                if len(terms) == most:
                    break
        offset += 1
        pieces = [piece for piece in pieces if offset <= len(piece) - 3]
    return terms
