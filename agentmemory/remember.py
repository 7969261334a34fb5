"""Explicit "remember this" requests in a user message: "remember (that) ...", "don't forget
...", "please remember: ...", "I want you to remember ...", "记住...", "别忘了...", "请记住...",
"请你记住...", "你记住：...", "好的，记住...", "我希望你记住...", "不要忘记...", "帮我记下来：...".

Only imperatives count. A question ("do you remember when...", "can you remember ...?",
"你还记得…吗", "你记住了吗？", "你记住没有"), a statement ("I remember ...", "我记住了",
"你记住了我的名字": 了 after the verb says it is done, not asked) or a clause with nothing after
the verb is not a request, so nothing is stored for it. Detection is per sentence;
the fact is the rest of that sentence (and the following ones of the same message, which usually
continue it), without the trigger words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# A sentence/clause boundary before the trigger: start, or after . ! ? ; newline or CJK stops.
_BOUNDARY = r"(?:^|(?<=[.!?;\n。！？；]))\s*"
_POLITE_EN = (
    r"(?:(?:hey|ok(?:ay)?|so|and|also|oh|btw)[,\s]+)?(?:please[,\s]+)?"
    # "I want you to remember ...": the request said through a wish, as often as the imperative.
    r"(?:(?:i\s+(?:really\s+)?(?:want|need|would\s+like)|i'?d\s+like)\s+you\s+to\s+)?"
    r"(?:(?:do|always)\s+)?"
)
_EN = re.compile(
    _BOUNDARY
    + _POLITE_EN
    + r"(?:remember|don'?t\s+forget|do\s+not\s+forget|never\s+forget|make\s+a\s+note)"
    + r"(?:\s+(?:this|that))?(?:\s*[:,-]\s*|\s+)(?P<fact>.+)",
    re.IGNORECASE | re.DOTALL,
)
# "remember when/what/how/if ..." is recalling, not storing.
_EN_RECALL = re.compile(
    r"^(?:when|what|how|if|whether|who|where|why|which|me\b|us\b|him\b|her\b|them\b)",
    re.IGNORECASE,
)
# Chinese asks in layers, each optional: an opener that acknowledges the previous turn and is
# set off by a comma ("好的，", "对了，"), who is asked and how politely ("请你", "我希望你",
# "麻烦你", "你"), a modal ("一定要", "务必"), then the verb. Longest alternatives first.
_ZH_OPENER = r"(?:(?:好的|好吧|好|嗯|行|对了|另外|还有|那|ok(?:ay)?)\s*[，,、:：!！]?\s*)?"
_ZH_ASK = (
    r"(?:(?:我希望你能|我希望您能|希望你能|我希望你|我希望您|希望你|我想让你|我想请你|我要你|"
    r"我需要你|请你|请您|请|麻烦你|麻烦您|麻烦|拜托你|拜托|帮我|你要|您要|你|您)\s*)?"
)
_ZH_MODAL = r"(?:(?:一定要|务必|千万要|千万|可要|要|得|给我)\s*)?"
_ZH_VERB = r"(?:记下来|记住|记下|记好|牢记|千万别忘了|别忘了|别忘记|不要忘了|不要忘记)"
_ZH = re.compile(
    _BOUNDARY
    + _ZH_OPENER
    + _ZH_ASK
    + _ZH_MODAL
    + _ZH_VERB
    # 了 after the verb reports it done ("你记住了我的名字") unless a pause follows and the
    # fact comes after it ("记住了：明天八点").
    + r"(?!了(?!\s*[:：,，]))(?:了)?"
    + r"(?:[:：,，、]\s*|\s*)(?P<fact>.+)",
    re.DOTALL | re.IGNORECASE,
)
_QUESTION_END = re.compile(r"(?:[?？]|(?:[吗呢嘛]|没有?)[。.!！]?)\s*$")
MIN_FACT_CHARS = 2


@dataclass(frozen=True, slots=True)
class RememberAsk:
    #: What follows the trigger words, as said ("my name." when only pointed at).
    fact: str
    #: The message's text before the trigger ("I am Marguerite. " in "I am Marguerite.
    #: Remember my name."): where a reference to something said just before is looked up first.
    before: str


def remember_request(text: str) -> str | None:
    """The fact to store when `text` asks to remember something, else None. As said: a
    reference ("remember my name", "remember that") is resolved by `remember_resolve`."""
    ask = remember_parse(text)
    return ask.fact if ask else None


def remember_parse(text: str) -> RememberAsk | None:
    """The request to remember in `text`, if it asks for one."""
    if not isinstance(text, str):
        return None
    for pattern, is_en in ((_EN, True), (_ZH, False)):
        for match in pattern.finditer(text):
            fact = match.group("fact").strip()
            first_clause = re.split(r"(?<=[.!?。！？])\s*", fact, maxsplit=1)[0]
            if _QUESTION_END.search(first_clause):
                continue
            if is_en and _EN_RECALL.match(fact):
                continue
            fact = fact.strip(" \t\n:：,，")
            if len(fact) >= MIN_FACT_CHARS or _reference_kind(fact):
                return RememberAsk(fact=fact, before=text[: match.start()])
    return None


# What the fact can point at instead of saying it. "that"/"it" alone, or "what I (just) said":
# the statement made just before. "my name": the name the user gave. "my <thing>" in a word or
# three, no verb: the sentence that said it ("remember my birthday" after "My birthday is May
# 3"). A fact that says something ("my birthday is May 3") is none of these.
_POINTER = re.compile(
    r"^(?:it|this|that|that one|those|these|all that|all of (?:it|this|that)|"
    r"what i (?:just |have |'ve )?(?:said|told you|wrote)|"
    r"这|那|它|这个|那个|这些|那些|这点|这一点|刚才说的|我刚才说的|上面说的|我说的)$",
    re.IGNORECASE,
)
_NAME_POINTER = re.compile(
    r"^(?:my (?:full )?name|who i am|what i(?:'m| am) called|"
    r"我的名字|我的全名|我叫什么(?:名字)?|我是谁)$",
    re.IGNORECASE,
)
_THING_POINTER = re.compile(
    r"^(?:my|our)\s+(?P<en>[a-z][\w'’-]*(?:\s+[a-z][\w'’-]*){0,2})$|^我的(?P<zh>[\u4e00-\u9fff]{1,6})$",
    re.IGNORECASE,
)
_VERBISH = re.compile(
    r"\b(?:is|are|was|were|am|be|been|has|have|had|do|does|did|can|will|would|should|"
    r"lives?|likes?|loves?|hates?|needs?|wants?|goes|works?)\b",
    re.IGNORECASE,
)
# How the user gives a name: "I am Marguerite Okonkwo-Hale", "my name is ...", "call me ...",
# "我叫王芳". The name itself starts with a capital (so "I am tired" gives none).
_NAME_GIVEN = (
    re.compile(
        r"(?i:\bmy name(?:'s| is)|\bi am|\bi'm|\bcall me|\bthis is|\bname's)\s+"
        r"(?P<name>[A-Z][\w'’-]*(?:\s+(?:[A-Z][\w'’-]*|de|van|von|da|di|le|la|del|bin))*)"
    ),
    re.compile(
        r"(?:我叫|我的名字是|我的名字叫|我名叫|叫我)\s*(?P<name>[\u4e00-\u9fff·A-Za-z]{1,12})"
    ),
)
_SENTENCE = re.compile(r"[^.!?\n。！？]+[.!?。！？]?")
# A resolved reference stores at most this much of the statement pointed at.
MAX_RESOLVED_RUNES = 500


def _reference_kind(fact: str) -> str | None:
    bare = fact.strip(" \t\n.。!！:：,，")
    if _NAME_POINTER.match(bare):
        return "name"
    if _POINTER.match(bare):
        return "pointer"
    thing = _THING_POINTER.match(bare)
    if thing and not (thing.group("en") and _VERBISH.search(thing.group("en"))):
        return "thing"
    return None


def remember_resolve(ask: RememberAsk, *, earlier: Callable[[], Sequence[str]]) -> str | None:
    """The fact to store for `ask`: as said, or, when it only points at something ("remember my
    name" after "I am Marguerite Okonkwo-Hale"), what it points at, looked up in the message
    before the request and then in `earlier()` (the user's previous messages, newest first;
    called only for a reference). None when a reference finds nothing: "my name." is no fact."""
    kind = _reference_kind(ask.fact)
    if kind is None:
        return ask.fact
    said = [ask.before, *earlier()]
    bare = ask.fact.strip(" \t\n.。!！:：,，")
    if kind == "name":
        zh = bool(re.search(r"[\u4e00-\u9fff]", bare))
        for text in said:
            for pattern in _NAME_GIVEN:
                found = list(pattern.finditer(text))
                if found:
                    name = found[-1].group("name").strip()
                    return f"我的名字是{name}" if zh else f"My name is {name}."
        return None
    if kind == "thing":
        needle = bare.lower()
        for text in said:
            for sentence in reversed(_SENTENCE.findall(text)):
                stated = sentence.strip()
                if needle in stated.lower() and len(stated) > len(needle) + 2:
                    return stated[:MAX_RESOLVED_RUNES]
        return ask.fact
    for text in said:
        stated = _statement(text)
        if stated:
            return stated[:MAX_RESOLVED_RUNES]
    return None


def _statement(text: str) -> str:
    """The sentences of `text` that state something (its questions left out)."""
    kept = [s.strip() for s in _SENTENCE.findall(text) if s.strip()]
    kept = [s for s in kept if not _QUESTION_END.search(s) and len(s) >= MIN_FACT_CHARS]
    return " ".join(kept)
