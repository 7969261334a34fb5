"""Explicit "remember this" requests in a user message: "remember (that) ...", "don't forget
...", "please remember: ...", "记住...", "别忘了...", "请记住...", "不要忘记...".

Only imperatives count. A question ("do you remember when...", "can you remember ...?",
"你还记得吗", "你记住了吗？"), a statement about oneself ("I remember ...") or a clause with
nothing after the verb is not a request, so nothing is stored for it. Detection is per sentence;
the fact is the rest of that sentence (and the following ones of the same message, which usually
continue it), without the trigger words.
"""

from __future__ import annotations

import re

# A sentence/clause boundary before the trigger: start, or after . ! ? ; newline or CJK stops.
_BOUNDARY = r"(?:^|(?<=[.!?;\n。！？；]))\s*"
_POLITE_EN = (
    r"(?:(?:hey|ok(?:ay)?|so|and|also|oh|btw)[,\s]+)?(?:please[,\s]+)?(?:(?:do|always)\s+)?"
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
_ZH = re.compile(
    _BOUNDARY
    + r"(?:(?:请|麻烦|帮我|你要|一定要|要)\s*)?"
    + r"(?:记住|牢记|别忘了|别忘记|不要忘了|不要忘记|千万别忘了)"
    + r"(?:[:：,，、]\s*|\s*)(?P<fact>.+)",
    re.DOTALL,
)
_QUESTION_END = re.compile(r"(?:[?？]|[吗呢嘛][。.!！]?)\s*$")
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
