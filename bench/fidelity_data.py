"""LoCoMo conversations (Maharana et al., ACL 2024) as `python -m bench fidelity` replays them,
and the scorer: is a question's evidence in the payload the model received?

Replay: the turns of every session in order; speaker_a is the user, speaker_b the model.
Consecutive turns of one speaker are one message (their texts a line apart); a turn that shares
a photo carries its caption ("[shares a photo: ...]"). Each user message is answered by speaker
b's next turns; a conversation that speaker_b opens starts with a short user opener, and one
that speaker_a closes gets a short acknowledgement.

Questions: categories 1-4 (5, adversarial, has no evidence in the conversation). Evidence ids
as the files spell them, with their slips mended ("D:11:26", "D8:6; D9:17"); an id that names
no turn is dropped, and a question left without evidence is counted, not scored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
OPENER = "Hi!"
CLOSER = "OK."
_EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)")
# recall quotes archived turns as data, "> " before each line: the scorer reads past it.
_QUOTE_PREFIX = re.compile(r"^[ \t]*>[ \t]?", re.MULTILINE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    #: What is sent: the turn's text, and its photo's caption.
    text: str


@dataclass(frozen=True, slots=True)
class Exchange:
    """One send: the user's message and the reply the model is scripted to give."""

    user: str
    reply: str
    #: The dialogue turns in the two messages.
    dia_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    speaker_a: str
    speaker_b: str
    turns: dict[str, Turn]
    exchanges: tuple[Exchange, ...]
    questions: tuple[Question, ...]
    #: Category 1-4 questions left out: none of their evidence ids names a turn.
    unscorable: int

    @property
    def runes(self) -> int:
        return sum(len(e.user) + len(e.reply) for e in self.exchanges)


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text") or "").strip()
    caption = str(turn.get("blip_caption") or "").strip()
    return f"{text} [shares a photo: {caption}]".strip() if caption else text


def _turns(data: dict[str, Any]) -> list[Turn]:
    sessions = sorted(
        (int(m.group(1)), key)
        for key in data
        if (m := _SESSION.fullmatch(key)) and isinstance(data[key], list)
    )
    return [
        Turn(dia_id=str(t["dia_id"]), speaker=str(t["speaker"]), text=turn_text(t))
        for _n, key in sessions
        for t in data[key]
        if turn_text(t)
    ]


def exchanges_build(turns: Sequence[Turn], *, speaker_a: str) -> list[Exchange]:
    groups: list[tuple[bool, list[Turn]]] = []
    for turn in turns:
        is_user = turn.speaker == speaker_a
        if groups and groups[-1][0] == is_user:
            groups[-1][1].append(turn)
        else:
            groups.append((is_user, [turn]))
    if groups and not groups[0][0]:
        groups.insert(0, (True, []))
    out = []
    for i in range(0, len(groups), 2):
        users = groups[i][1]
        replies = groups[i + 1][1] if i + 1 < len(groups) else []
        out.append(
            Exchange(
                user="\n".join(t.text for t in users) or OPENER,
                reply="\n".join(t.text for t in replies) or CLOSER,
                dia_ids=tuple(t.dia_id for t in [*users, *replies]),
            )
        )
    return out


def evidence_ids(raw: Any, *, known: dict[str, Turn]) -> tuple[str, ...]:
    ids: list[str] = []
    for item in raw if isinstance(raw, list) else []:
        for m in _EVIDENCE_ID.finditer(str(item)):
            dia_id = f"D{int(m.group(1))}:{int(m.group(2))}"
            if dia_id in known and dia_id not in ids:
                ids.append(dia_id)
    return tuple(ids)


def conversation_load(path: Path) -> Conversation:
    data = json.loads(path.read_text(encoding="utf-8"))
    turns = _turns(data)
    known = {t.dia_id: t for t in turns}
    questions, unscorable = [], 0
    for qa in data.get("qa", []):
        category = qa.get("category")
        if category not in CATEGORIES:
            continue
        evidence = evidence_ids(qa.get("evidence"), known=known)
        if not evidence:
            unscorable += 1
            continue
        questions.append(
            Question(question=str(qa["question"]), category=int(category), evidence=evidence)
        )
    return Conversation(
        name=path.stem,
        speaker_a=str(data["speaker_a"]),
        speaker_b=str(data["speaker_b"]),
        turns=known,
        exchanges=tuple(exchanges_build(turns, speaker_a=str(data["speaker_a"]))),
        questions=tuple(questions),
        unscorable=unscorable,
    )


def conversation_cut(conv: Conversation, *, turns: int, questions: int) -> Conversation:
    """The first `turns` dialogue turns (whole exchanges) and the first `questions` questions
    whose evidence all lies within them: a quick run of the same method."""
    kept: list[Exchange] = []
    seen = 0
    for exchange in conv.exchanges:
        if seen >= turns:
            break
        kept.append(exchange)
        seen += len(exchange.dia_ids)
    within = {d for e in kept for d in e.dia_ids}
    asked = [q for q in conv.questions if set(q.evidence) <= within][:questions]
    return replace(conv, exchanges=tuple(kept), questions=tuple(asked))


def conversations_find(data_dir: Path, names: Sequence[str] = ()) -> list[Path]:
    """The conversation files of `data_dir` (all `*.json`, or those `names` ask for)."""
    if names:
        paths = [data_dir / f"{n.removesuffix('.json')}.json" for n in names]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"no such conversation file: {', '.join(missing)}")
        return paths
    return sorted(data_dir.glob("*.json"), key=lambda p: (len(p.stem), p.stem))


# --- the scorer ------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Whitespace collapsed, recall's "> " quote prefixes gone."""
    return " ".join(_QUOTE_PREFIX.sub("", text).split())


def longest_sentence(text: str) -> str:
    return max(_SENTENCE_END.split(normalise(text)), key=len)


def message_content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def payload_haystack(messages: Sequence[dict[str, Any]], *, question: str) -> str:
    """The text the model was sent, less the question itself (taken out of the last user
    message once: whatever else that message carries counts)."""
    last_user = max(
        (i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages)
    )
    parts = []
    for i, message in enumerate(messages):
        content = message_content(message)
        if i == last_user:
            content = content.replace(question, "", 1)
        parts.append(content)
    return normalise("\n".join(parts))


def evidence_present(*, haystack: str, text: str) -> bool:
    """The turn is in the (normalised) payload verbatim, or at least its longest sentence."""
    whole = normalise(text)
    return whole in haystack or longest_sentence(text) in haystack


def question_covered(*, haystack: str, question: Question, turns: dict[str, Turn]) -> bool:
    return all(
        evidence_present(haystack=haystack, text=turns[dia_id].text) for dia_id in question.evidence
    )
