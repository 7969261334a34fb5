"""Concepts: the kinds of thing a question asks for instances of, spelled out, for recall
(chat/search/recall_auto.py). "What martial arts has John done?" shares no word with "I'm off
to do some taekwondo!", nor "What European countries has Maria been to?" with "took this pic
in Spain": lexical recall cannot find them, and a list question is exactly the one whose answer
is spread over turns the summary dropped.

The kind is what follows "what", "which" or "how many" ("what kind of"...): a two-word compound
where WordNet has one ("martial arts"), else the first word naming a kind. It is looked up in
WordNet (Princeton WordNet 3.0, nouns, chat/search/data/, built by devtools/wordnet_build.py):
its most frequent sense, that sense's other names and its hyponyms three levels down ("martial
art": judo, karate, taekwondo...; "European country": Spain, England...) are the concept's
members. Recall matches them as whole words in the rows it holds in memory and scores each
member a message names as a term of its own (BM25's idf of the messages naming it, halved: a
concept is a guess, a word of the message is not).

What is left out, and why:
- every other noun of a message: expanded too (any noun, on LoCoMo), they matched as much noise
  as evidence (one question more on conversation 41, three fewer on 43 at 16,000 runes), and
  the window's words are read before the first token of the first one asked (~4 ms for
  1,000 messages of seed_demo's), which a message that asks for no kind does not pay;
- a capitalised word: a name ("John" is also WordNet's word for a toilet);
- a sense with no hyponyms ("pet", "knee"): not a kind of thing with kinds under it;
- a concept with more than MEMBERS_MAX members ("activity", "music"): too vague to say
  anything (and more members to look for before the first token);
- anything but English nouns.

Functions on strings, and KindTexts, which reads its texts' words once. The graph (1.5 MB
compressed) is read once per process, ~0.2 s and ~25 MB: at server start (cadau/serve.py), else
on the first question that asks for a kind.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import itertools
import json
import re
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from chat.search.terms import stopword

DATA = Path(__file__).resolve().parent / "data" / "wordnet-nouns.json.gz"
# How far below a sense its hyponyms are members ("exercise" -> "aerobics" -> "step
# aerobics").
DEPTH = 3
# A concept with more members than this expands to nothing (see the module's docstring).
MEMBERS_MAX = 400
# Concepts per message: the first ones asked for.
CONCEPTS_MAX = 3
# What of a message is read for them: a question is short; a long message (pasted code, a
# document) is not read to its end before the first token.
TEXT_MAX_CHARS = 2000
# Members shorter than this ("do", "go") are other words too.
MEMBER_MIN_CHARS = 3
# WordNet's own rules for a noun's plural (its "morphy"), after its list of irregular ones.
_PLURALS = (("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
            ("men", "man"), ("ies", "y"), ("s", ""))  # fmt: skip


class _Lists:
    """A list of lists of ints, flat in two arrays: with the 82k synsets' lemmas and hyponyms
    as Python lists the graph added 45 MB to a process's resident memory, as arrays 25."""

    __slots__ = ("_items", "_starts")

    def __init__(self, lists: list[list[int]]) -> None:
        self._starts = array("i", itertools.accumulate(map(len, lists), initial=0))
        self._items = array("i", itertools.chain.from_iterable(lists))

    def __getitem__(self, i: int) -> array[int]:
        return self._items[self._starts[i] : self._starts[i + 1]]


@dataclass(frozen=True, slots=True)
class _Graph:
    lemmas: list[str]
    number: dict[str, int]  # lemma -> its index in `lemmas`
    synsets: _Lists  # synset -> its lemmas
    hyponyms: _Lists  # synset -> its hyponyms (instance hyponyms included)
    first: array[int]  # lemma -> its most frequent sense
    exceptions: dict[str, str]  # irregular plural -> singular


_graph_lock = threading.Lock()
_graph_read_once: _Graph | None = None


def _graph() -> _Graph:
    global _graph_read_once
    # Recall runs in worker threads: two first questions at once read it once.
    if _graph_read_once is None:
        with _graph_lock:
            if _graph_read_once is None:
                _graph_read_once = _graph_read()
    return _graph_read_once


def concepts_load() -> None:
    """Read the graph now (the server does at start): a question's first token never waits for
    it, and no stream of the process stalls while json holds the interpreter for it."""
    _graph()


def _graph_read() -> _Graph:
    with gzip.open(DATA) as source:
        data = json.load(source)
    lemmas = data["lemmas"]
    return _Graph(
        lemmas=lemmas,
        number={lemma: i for i, lemma in enumerate(lemmas)},
        synsets=_Lists(data["synsets"]),
        hyponyms=_Lists(data["hyponyms"]),
        first=array("i", data["first"]),
        exceptions=data["exceptions"],
    )


def _base(word: str) -> int | None:
    """The lemma `word` is a form of (its index), by WordNet's morphy rules: the word itself,
    an irregular plural, then the regular ones; the first found (morphy returns them all)."""
    graph = _graph()
    word = word.casefold()
    for form in (word, graph.exceptions.get(word, "")):
        if form in graph.number:
            return graph.number[form]
    for suffix, ending in _PLURALS:
        if word.endswith(suffix):
            found = graph.number.get(word[: -len(suffix)] + ending)
            if found is not None:
                return found
    return None


@functools.lru_cache(maxsize=4096)
def concept_members(word: str) -> frozenset[str]:
    """The members of `word`'s concept (case-folded, the word itself left out); empty when it
    is no noun, its sense has no hyponyms, or it has more than MEMBERS_MAX members."""
    base = _base(word)
    if base is None:
        return frozenset()
    graph = _graph()
    sense = graph.first[base]
    if not graph.hyponyms[sense]:
        # Not a kind of thing with kinds under it ("knee", "logic"): its other names alone
        # are seldom what a turn says instead.
        return frozenset()
    members: set[str] = set()
    seen: set[int] = set()
    level = [sense]
    for depth in range(DEPTH + 1):
        following: list[int] = []
        for synset in level:
            if synset in seen:
                continue
            seen.add(synset)
            members.update(graph.lemmas[i] for i in graph.synsets[synset])
            if depth < DEPTH:
                following += graph.hyponyms[synset]
        if len(members) > MEMBERS_MAX + 1:
            return frozenset()
        level = following
    members.discard(graph.lemmas[base])
    members = {m for m in members if len(m) >= MEMBER_MIN_CHARS}
    return frozenset(members) if len(members) <= MEMBERS_MAX else frozenset()


# A question asking for instances of a kind: "what martial arts", "which countries", "how many
# children", "what kind of music". The words after it are read by a lookahead, so that the next
# question word in them starts a match of its own ("what books and which movies").
_ASKS_KIND = re.compile(
    r"\b(?:what|which|how\s+many)\s+(?:(?:kinds?|types?|sorts?)\s+of\s+)?"
    r"(?=((?:[A-Za-z]+(?:['-][A-Za-z]+)*\s+){0,2}[A-Za-z]+(?:['-][A-Za-z]+)*))",
    re.IGNORECASE,
)
# Words that end what a kind can be: the next question, a conjunction.
_KIND_ENDS = frozenset(("what", "which", "how", "and", "or", "but"))
# The frame of a question, not a kind it asks for ("which one", "what time", "which way").
_NOT_KINDS_TEXT = (
    "one ones way ways thing things time times lot bit part kind type sort sorts number"
)
_NOT_KINDS = frozenset(_NOT_KINDS_TEXT.split())


def concepts_named(text: str) -> list[str]:
    """The kinds `text` asks for instances of (case-folded), at most CONCEPTS_MAX, in the order
    asked."""
    found: list[str] = []
    for match in _ASKS_KIND.finditer(text[:TEXT_MAX_CHARS]):
        words = list(
            itertools.takewhile(lambda w: w.casefold() not in _KIND_ENDS, match[1].split())
        )
        kind = _kind(words)
        if kind is not None and kind not in found:
            found.append(kind)
            if len(found) == CONCEPTS_MAX:
                break
    return found


def _kind(words: list[str]) -> str | None:
    """The kind the words after "what" name: the first two-word compound WordNet knows as one
    ("martial arts", "European countries"), else the first word that names a kind, never a
    name (capitalised) or a filler word."""
    for first, second in itertools.pairwise(words):
        if concept_members(pair := f"{first} {second}".casefold()):
            return pair
    for word in words:
        folded = word.casefold()
        if word[0].isupper() or len(word) < MEMBER_MIN_CHARS or folded in _NOT_KINDS:
            continue
        if not stopword(folded) and concept_members(folded):
            return folded
    return None


def _is_word(char: str) -> bool:
    """What a regular expression's \\w matches, for one character."""
    return char.isalnum() or char == "_"


# Every ASCII byte \w does not match, to a space: bytes.translate and bytes.split read a text's
# words in C. (str.translate has a fast path for ASCII text only: 3.5 ms for LoCoMo's 90k
# characters of conversation 41, with its curly quotes, against 0.2 in bytes; re.findall(r"\w+")
# takes three times as long as either.)
_NOT_WORDS = bytes(c for c in range(128) if not _is_word(chr(c)))
_NOT_WORDS_TO_SPACES = bytes.maketrans(_NOT_WORDS, b" " * len(_NOT_WORDS))
_WORD = re.compile(r"\w+")


def words_of(texts: Iterable[str]) -> set[str]:
    """Every ASCII word of `texts` (a run of \\w all of whose characters are ASCII): what
    WordNet's members, all ASCII, are made of (KindTexts.present looks for any other member
    whatever the words). A run with a character beyond ASCII ("naïve", a Chinese sentence) is
    no member's word, and kept it would copy most of a text in a script without spaces."""
    raw = " ".join(texts).encode(errors="surrogatepass")
    tokens = set(raw.translate(_NOT_WORDS_TO_SPACES).split())
    # One decode for the distinct tokens, not one each.
    words = set(b" ".join(tokens).decode(errors="surrogatepass").split(" "))
    for joined in [w for w in words if not w.isascii()]:
        words.discard(joined)
        words.update(w for w in _WORD.findall(joined) if w.isascii())
    words.discard("")
    return words


@functools.lru_cache(maxsize=4096)
def _with_words(concept: str) -> dict[str, tuple[str, ...]]:
    """The members of `concept`, each with its ASCII words ("tae kwon do": tae, kwon, do)."""
    return {
        member: tuple(w for w in _WORD.findall(member) if w.isascii())
        for member in sorted(concept_members(concept))
    }


@functools.lru_cache(maxsize=4096)
def _by_word(concept: str) -> dict[str, tuple[str, ...]]:
    """The members of `concept` by each of their words; under "" those with none."""
    found: dict[str, list[str]] = {}
    for member, parts in _with_words(concept).items():
        for part in parts or ("",):
            found.setdefault(part, []).append(member)
    return {word: tuple(members) for word, members in found.items()}


def _whole_at(text: str, member: str, start: int = 0) -> int:
    """Where `member` first stands in `text` from `start` as a whole word (no word character
    either side), else -1. Not \\b: a member may start or end with punctuation ("s.u.v.")."""
    at = text.find(member, start)
    while at >= 0:
        end = at + len(member)
        if not (at and _is_word(text[at - 1])) and not (end < len(text) and _is_word(text[end])):
            return at
        at = text.find(member, at + 1)
    return -1


class KindTexts:
    """Case-folded texts to find kinds' members in, as whole words. A kind has up to
    MEMBERS_MAX members and a text names few of them: the texts' words are read once (on the
    first kind asked of them: ~4 ms for 1,000 messages of seed_demo's, 361k characters), and
    only the members whose words are all among them are looked for, by substring (0.1 ms at
    the median for bench ttft's 57 kinds in those messages, 2.5 at most). One pattern of all
    the members, compiled per kind (3 ms on average) and run over every text (8 ms), was what
    each kind a question asked for cost before the first token."""

    __slots__ = ("_words", "texts")

    def __init__(self, texts: list[str], *, words: set[str] | None = None) -> None:
        self.texts = texts
        self._words = words

    @property
    def words(self) -> set[str]:
        if self._words is None:
            self._words = words_of(self.texts)
        return self._words

    def words_read(self) -> set[str] | None:
        """Its words, if a kind has been asked of it (else None: not read)."""
        return self._words

    def present(self, concept: str) -> tuple[str, ...]:
        """The members of `concept` that may be in the texts (each of their words is), in
        order."""
        words, by_word, parts = self.words, _by_word(concept), _with_words(concept)
        # From whichever side is smaller: a window moved by two rows has a few dozen words,
        # and up to NAMED_KINDS_MAX kinds of up to MEMBERS_MAX members each are carried over
        # (chat/search/archive_window.py), before the first token of every send.
        if len(words) < len(by_word):
            candidates = {m for w in words for m in by_word.get(w, ())}
        else:
            candidates = {m for w, members in by_word.items() if w in words for m in members}
        candidates.update(by_word.get("", ()))
        return tuple(sorted(m for m in candidates if all(w in words for w in parts[m])))

    def naming(self, concept: str) -> dict[str, list[int]]:
        """For each member of `concept` the texts name as a whole word, their positions, in
        order."""
        present = self.present(concept)
        if not present:
            return {}
        # One string: each member's occurrences are found in C, not each text tried in turn
        # (the join takes ~0.02 ms for 1,000 texts; a member holds no newline).
        joined = "\n".join(self.texts)
        starts = list(itertools.accumulate((len(t) + 1 for t in self.texts), initial=0))
        found: dict[str, list[int]] = {}
        for member in present:
            at = _whole_at(joined, member)
            while at >= 0:
                i = bisect.bisect_right(starts, at) - 1
                found.setdefault(member, []).append(i)
                at = _whole_at(joined, member, starts[i + 1])  # this text is found
        return found
