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


def remember_request(text: str) -> str | None:
    """The fact to store when `text` asks to remember something, else None."""
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
            if len(fact) >= MIN_FACT_CHARS:
                return fact
    return None
