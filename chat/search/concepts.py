"""Concepts: the kinds of thing a message names, spelled out, for recall
(chat/search/recall_auto.py). "What martial arts has John done?" shares no word with "I'm off
to do some taekwondo!", nor "What European countries has Maria been to?" with "took this pic
in Spain": lexical recall cannot find them, and a list question ("what X has ...") is exactly
the question whose answer is spread over turns the summary dropped.

A noun of the new message (or a two-word compound, "martial arts") is looked up in WordNet
(Princeton WordNet 3.0, nouns, chat/search/data/, built by devtools/wordnet_build.py): its most
frequent sense, that sense's other names and its hyponyms three levels down ("martial art":
judo, karate, taekwondo...; "European country": Spain, England...) are the concept's members.
Recall matches them as whole words in the rows it holds in memory and scores a message holding
any of them as one term (its weight BM25's idf of all the messages that do, halved: a concept
is a guess, a word of the message is not).

What is left out, and why:
- a single capitalised word: a name ("John" is also WordNet's word for a toilet);
- a concept with more than MEMBERS_MAX members ("activity", "state"): too vague to say
  anything, and too long a pattern to match before the first token;
- anything but English nouns.

Pure functions on strings; the graph (1.5 MB compressed, ~0.1 s) is read once per process, on
the first message that names a noun.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat.search.terms import TERMS_MAX, recall_terms, stopword

DATA = Path(__file__).resolve().parent / "data" / "wordnet-nouns.json.gz"
# How far below a sense its hyponyms are members ("exercise" -> "aerobics" -> "step
# aerobics").
DEPTH = 3
# A concept with more members than this expands to nothing (see the module's docstring).
MEMBERS_MAX = 400
# Concepts per message: the first ones named.
CONCEPTS_MAX = 3
# Words of a message looked at.
WORDS_MAX = 200
# Members shorter than this ("do", "go") are other words too.
MEMBER_MIN_CHARS = 3
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
# WordNet's own rules for a noun's plural (its "morphy"), after its list of irregular ones.
_PLURALS = (("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
            ("men", "man"), ("ies", "y"), ("s", ""))  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Graph:
    lemmas: list[str]
    number: dict[str, int]  # lemma -> its index in `lemmas`
    synsets: list[list[int]]  # synset -> its lemmas
    hyponyms: list[list[int]]  # synset -> its hyponyms (instance hyponyms included)
    first: list[int]  # lemma -> its most frequent sense
    exceptions: dict[str, str]  # irregular plural -> singular


@functools.cache
def _graph() -> _Graph:
    with gzip.open(DATA) as source:
        data = json.load(source)
    lemmas = data["lemmas"]
    return _Graph(
        lemmas=lemmas,
        number={lemma: i for i, lemma in enumerate(lemmas)},
        synsets=data["synsets"],
        hyponyms=data["hyponyms"],
        first=data["first"],
        exceptions=data["exceptions"],
    )


def _base(word: str) -> int | None:
    """The lemma `word` is a form of (its index), as WordNet's morphy finds it: the word
    itself, an irregular plural, then the regular ones."""
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
    is no noun, has no other names or hyponyms, or more than MEMBERS_MAX."""
    base = _base(word)
    if base is None:
        return frozenset()
    graph = _graph()
    members: set[str] = set()
    seen: set[int] = set()
    level = [graph.first[base]]
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


def concepts_named(text: str) -> list[str]:
    """The concepts `text` names (case-folded), at most CONCEPTS_MAX: first its two-word
    compounds that are WordNet's ("martial arts", "European countries"), in the order named,
    then its single words as recall ranks its terms (chat/search/terms.py: the longer first),
    leaving out names (capitalised) and the words a compound took."""
    # A long message (pasted code, a document) is not a question: its first words will do.
    words = [m.group(0) for m in itertools.islice(_WORD.finditer(text), WORDS_MAX)]
    found: list[str] = []
    taken: set[str] = set()
    for first, second in itertools.pairwise(words):
        pair = f"{first} {second}".casefold()
        if first.casefold() in taken or stopword(first) or stopword(second):
            continue
        if concept_members(pair):
            found.append(pair)
            taken.update((first.casefold(), second.casefold()))
    for term in recall_terms(" ".join(words), most=TERMS_MAX):
        word = term.casefold()
        if term[0].isupper() or word in taken or not _WORD.fullmatch(term):
            continue
        if concept_members(word):
            found.append(word)
    return list(dict.fromkeys(found))[:CONCEPTS_MAX]


@functools.lru_cache(maxsize=1024)
def concept_pattern(concept: str) -> re.Pattern[str]:
    """Any member of `concept` as a whole word, in case-folded text. The members as a trie
    ("tae(?:kwondo| kwon do)"): a plain alternation of 125 words scanned 1,000 messages (127k
    characters) in ~10 ms, the trie in ~2.5."""
    trie: dict[str, Any] = {}
    for member in concept_members(concept):
        node = trie
        for char in member:
            node = node.setdefault(char, {})
        node[""] = {}  # a member ends here
    return re.compile(r"\b" + _trie_pattern(trie) + r"\b")


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [
        re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char
    ]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if "" in node:  # a member ends here, and longer ones go on
        return body + "?" if len(branches) == 1 and len(branches[0]) == 1 else f"(?:{body})?"
    return body
