"""What a sentence carries: the pure text functions the summary guard and the extractive
fallback share (no model, no I/O).

- `sentences_split`: sentence ends in English (. ! ? followed by a space) and Chinese (。！？,
  no spaces), so nothing downstream cuts mid-word;
- `identifiers_find`: things a summary must copy exactly: URLs, e-mail addresses, paths, code
  spans, dates, and tokens that carry digits ("4471-KX", "v2.3", "10.0.4.17:5432", "3000 元").
  A capitalised word is not one: "Hi", "My" and "What" open sentences, they identify nothing;
- `sentence_weight`: how much a sentence is worth keeping, by what it carries (identifiers,
  names, places, dates, first-person statements and preferences), not by where it stands.
  Small talk ("Hey Mel! Good to see you!") weighs nothing.
"""

from __future__ import annotations

import re

# A sentence runs to . ! ? … (then a space or the end) or to a Chinese terminator; a line
# break always ends one. Closing quotes and brackets stay with their sentence.
_SENTENCE = re.compile(
    r"\S.*?(?:[.!?…]+[\"'”’)\]]*(?=\s|$)|[。！？!?]+[」』”’）)\"']*|$)", re.MULTILINE
)

_URL = re.compile(r"https?://[^\s<>\"'）)\]，。]+")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_PATH = re.compile(
    r"(?:~|\.{1,2})?(?:/[\w.@+-]+){2,}/?"
    r"|\b[\w-]+(?:/[\w.-]+)+\.\w+\b"
    r"|\b[\w-]+\.(?:py|js|ts|md|json|yaml|yml|toml|txt|csv|sql|html|css|go|rs|sh)\b"
)
_CODE = re.compile(r"`[^`\n]{1,80}`")
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
# "8 May 2023", "May 8, 2023", "May 2023", "8 May": a month name counts only with a number.
_DATE_WORDS = re.compile(
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?(?:,?\s+\d{{4}})?\b"
    rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
    rf"|\b{_MONTH}\.?,?\s+\d{{4}}\b"
)
_DATE_CJK = re.compile(
    r"\d{2,4}\s?年(?:\s?\d{1,2}\s?月)?(?:\s?\d{1,2}\s?[日号])?|\d{1,2}\s?月\s?\d{1,2}\s?[日号]"
)
# A token of ASCII letters, digits and joiners (Han characters never join it: "代码是4471-KX"
# yields "4471-KX"), with a CJK counter or unit glued on where one follows ("3000 元").
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_])[$€£#+-]?[A-Za-z0-9_][A-Za-z0-9_.:/+#%-]*"
    r"(?:\s?[万亿元个条次天年月日号岁])?"
)
# "3,000" and "1,250.50": the thousands commas belong to the number.
_GROUPED = re.compile(
    r"(?<![\w.])[$€£]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:\s?[万亿元个条次天年月日号岁])?"
)
_ORDINAL = re.compile(r"^\d(?:st|nd|rd|th)$", re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*\d{1,3}[.)]\s", re.MULTILINE)


def sentences_split(text: str) -> list[str]:
    """The sentences of `text` in order, whitespace collapsed; never cuts inside a word."""
    found = (" ".join(m.group().split()) for m in _SENTENCE.finditer(text))
    return [s for s in found if s]


def _is_identifier_token(token: str) -> bool:
    digits = sum(c.isdigit() for c in token)
    if not digits or _ORDINAL.match(token):
        return False
    letters = any(c.isascii() and c.isalpha() for c in token)
    # "7" alone is a count, not an identifier; "v2", "db-7", "42" and "3.5" are.
    return digits >= 2 or letters or any(c in ".:/-_" for c in token.strip(".:/-_"))


def identifiers_find(text: str) -> list[str]:
    """Identifiers in `text`, in order of appearance, each once."""
    text = _LIST_MARKER.sub(" ", text)
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for pattern in (_URL, _EMAIL, _CODE, _PATH, _DATE_WORDS, _DATE_CJK, _GROUPED, _TOKEN):
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(s < end and start < e for s, e in taken):
                continue  # a number inside a URL is already kept by the URL
            value = match.group().strip().rstrip(".,;:!?-")
            if pattern is _TOKEN and not _is_identifier_token(value):
                continue
            if value:
                taken.append((start, end))
                found.append((start, value))
    found.sort()
    unique: list[str] = []
    for _, value in found:
        if value not in unique:
            unique.append(value)
    return unique


def identifier_listable(identifier: str) -> bool:
    """Worth listing on its own, without the sentence it came from: not a bare small number
    ("14" or "18个" says nothing alone; "8443", "3000 元", "v2" and "2026-12-31" do)."""
    number = identifier.rstrip("万亿元个条次天年月日号岁").strip()
    return not (number.isdigit() and len(number) <= 3)


def identifier_key(text: str) -> str:
    """How identifiers are compared: case, spaces, thousands commas and dash styles aside
    ("3,000" is "3000", "KX–4471" is "kx-4471")."""
    return re.sub(r"[\s,]", "", text.lower()).translate(str.maketrans("‐‑‒–—", "-----"))


_NAME = re.compile(r"(?<=[a-z0-9,;:)] )[A-Z][a-z]+(?:[ -][A-Z][a-z]+)*")
_NOT_NAMES = frozenset(
    [
        "I",
        "I'm",
        "I've",
        "I'd",
        "I'll",
        "OK",
        "Okay",
        "Yes",
        "No",
        "Mr",
        "Mrs",
        "Ms",
        "Dr",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ]
)
_FIRST_PERSON = re.compile(
    r"\b(?:I|we)(?:'m|'ve| am| was| were| have| had| live| lived| work| worked| grew| moved"
    r"| own| bought| started| study| studied| teach| went| visited| got| joined| adopted"
    r"| plan| will| use| run| need| want| keep| signed| finished| met| married| love| like"
    r"| prefer| hate| enjoy| just)\b"
    r"|\b(?:my|our)\s+(?:\w+\s+){0,3}?(?:is|are|was|were|has|have)\b|\bmy name\b|\bcall me\b"
    r"|我(?:是|叫|住|在|的|们|有|要|想|去|来自|工作|养|刚|已经|打算|计划|最|爱)",
    re.IGNORECASE,
)
_PREFERENCE = re.compile(
    r"\bfavou?rite\b|\bprefer\w*\b|\b(?:I|we)\s+(?:really\s+)?(?:love|like|hate|enjoy|adore"
    r"|can't stand|don't like|do not like)\b|\ballergic\b|\bvegetarian\b|\bvegan\b"
    r"|\b(?:please\s+)?(?:always|never)\s+\w+|\bdon't ever\b"
    r"|喜欢|最爱|讨厌|偏好|不吃|过敏|总是|从不|千万别|一定要",
    re.IGNORECASE,
)
_TASK = re.compile(
    r"\b(?:todo|to-do|need to|have to|must|remind me|plan to|going to|deadline|due)\b"
    r"|需要|得|提醒我|计划|截止|待办",
    re.IGNORECASE,
)
_WHEN = re.compile(
    rf"\b(?:{_MONTH}|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|yesterday|today"
    r"|tomorrow|tonight|weekend|birthday|anniversary|ago|since|last\s+(?:week|month|year|night)"
    r"|next\s+(?:week|month|year))\b|昨天|今天|明天|去年|明年|上周|下周|星期|周[一二三四五六日末]|生日",
    re.IGNORECASE,
)
_PLACE = re.compile(
    r"\b(?:in|at|from|to|near|visited|moved to|live in)\s+(?:the\s+)?[A-Z][a-z]+"
    r"|住在|来自|搬到|去了"
)
_SMALL_TALK = re.compile(
    r"^\W*(?:hey|hi|hello|hiya|yo|wow|oh|ah|aw+|haha\w*|lol|thanks?|thank you|cheers|bye"
    r"|good(?:bye| night| morning| evening| to (?:see|hear|know) you)|see you|take care"
    r"|great|awesome|cool|nice|sure|ok(?:ay)?|yes|yeah|yep|no|nope|congrat\w*|glad|sounds good"
    r"|that's (?:great|awesome|cool|amazing|nice|so \w+)|you too|me too|same here)\b"
    r"|^\W*(?:你好|您好|嗨|哈喽|谢谢|多谢|哈哈|好久不见|再见|早上好|晚上好|不客气|好的|太棒了)",
    re.IGNORECASE,
)
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z0-9]+")


def names_find(text: str) -> list[str]:
    """Likely proper names: capitalised words inside a sentence (a sentence's first word is
    capitalised whatever it is), without pronouns and weekdays."""
    return [n for n in _NAME.findall(text) if n not in _NOT_NAMES]


def _word_count(text: str) -> int:
    # A Han character counts as a word (as in chat/context/heading.py).
    return len(_HAN.findall(text)) + len(_LATIN_WORD.findall(text))


def sentence_weight(sentence: str) -> int:
    """How much `sentence` carries; 0 for small talk and fragments that carry nothing."""
    ids = identifiers_find(sentence)
    weight = 3 * min(len(ids), 3)
    weight += 2 * min(len(names_find(sentence)), 2)
    if _FIRST_PERSON.search(sentence):
        weight += 2
    if _PREFERENCE.search(sentence):
        weight += 2
    if _WHEN.search(sentence):
        weight += 1
    if _PLACE.search(sentence):
        weight += 1
    if _TASK.search(sentence):
        weight += 1
    if sentence.rstrip().endswith(("?", "？")) and not ids:
        weight -= 1
    if _SMALL_TALK.search(sentence):
        weight -= 3
    if _word_count(sentence) < 4 and not ids:
        return 0
    return max(weight, 0)


def sentence_kind(sentence: str) -> str:
    """Which summary section a kept sentence belongs to: "preference", "task" or "fact"."""
    if _PREFERENCE.search(sentence):
        return "preference"
    if _TASK.search(sentence) and not sentence.rstrip().endswith(("?", "？")):
        return "task"
    return "fact"


def clause_cut(text: str, *, limit: int) -> str:
    """`text` at most `limit` runes, cut at a clause or word boundary (never mid-word), with
    "…" marking the cut. Chinese has no spaces: its clause marks and characters are boundaries."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 1, 0)]
    for marks in (",;:，；：、", " "):
        at = max(head.rfind(m) for m in marks)
        if at >= limit // 2:
            return head[:at].rstrip(" ,;:，；：、") + "…"
    if _HAN.search(head[-1:] or ""):
        return head + "…"
    # One long token (a URL, a hash): cut at the last space before it, or drop it whole.
    at = head.rfind(" ")
    return head[:at].rstrip() + "…" if at > 0 else ""
