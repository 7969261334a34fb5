"""`python -m bench fidelity` on a tiny LoCoMo-shaped conversation (tests/bench/data/locomo):
the replay it builds, the scorer (exact: the whole conversation scores every question, a
missing evidence turn fails its question), and a short real replay through a Daphne server
and the fake model server over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.fidelity import Config, configs_plan, measure, results_merge
from bench.fidelity_data import (
    CLOSER,
    OPENER,
    Conversation,
    Exchange,
    Turn,
    conversation_cut,
    conversation_load,
    conversations_find,
    evidence_present,
    exchanges_build,
    longest_sentence,
    payload_haystack,
    question_covered,
)
from bench.fidelity_report import render

DATA = Path(__file__).parent / "data" / "locomo"


@pytest.fixture
def tiny() -> Conversation:
    return conversation_load(DATA / "tiny.json")


def _payload(conv: Conversation, question: str) -> list[dict[str, Any]]:
    """What a model sent the whole conversation receives."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for exchange in conv.exchanges:
        messages.append({"role": "user", "content": exchange.user})
        messages.append({"role": "assistant", "content": exchange.reply})
    return [*messages, {"role": "user", "content": question}]


def test_the_replay_joins_a_speakers_turns_and_keeps_captions(tiny: Conversation) -> None:
    assert [e.dia_ids for e in tiny.exchanges] == [
        ("D1:1", "D1:2"),
        ("D1:3", "D1:4", "D1:5", "D1:6"),
        ("D1:7", "D1:8", "D2:1"),
        ("D2:2", "D2:3"),
        ("D2:4", "D2:5"),
        ("D2:6", "D3:1", "D3:2"),
        ("D3:3", "D3:4"),
    ]
    second = tiny.exchanges[1]
    assert second.user == (
        "She hid under the sofa for two days. Now she sleeps on my desk while I write code for "
        "the Orion project. [shares a photo: a photo of a grey cat sleeping on a keyboard]\n"
        "My manager Claire says the Orion release is due on 14 April."
    )
    assert second.reply.startswith("That is a tight deadline.")
    assert second.reply.endswith("\nMy target time is one hour and forty-five minutes.")
    # Speaker b opening the conversation: a short opener gives the reply a user message; a
    # conversation speaker a closes gets a short acknowledgement.
    turns = [Turn("D1:1", "Ben", "Hello."), Turn("D1:2", "Ana", "Hi."), Turn("D1:3", "Ana", "Bye.")]
    assert exchanges_build(turns, speaker_a="Ana") == [
        Exchange(user=OPENER, reply="Hello.", dia_ids=("D1:1",)),
        Exchange(user="Hi.\nBye.", reply=CLOSER, dia_ids=("D1:2", "D1:3")),
    ]


def test_questions_are_categories_1_to_4_with_mended_evidence(tiny: Conversation) -> None:
    assert [(q.category, q.evidence) for q in tiny.questions] == [
        (4, ("D1:1",)),
        (2, ("D1:5",)),
        (1, ("D1:3", "D3:1")),
        (4, ("D2:3",)),  # "D:2:3"
        (3, ("D3:3", "D3:4")),  # "D3:3; D3:4"
    ]
    assert tiny.unscorable == 1  # "D9:9" names no turn; category 5 is left out, not counted
    quick = conversation_cut(tiny, turns=6, questions=10)
    assert len(quick.exchanges) == 2
    assert [q.evidence for q in quick.questions] == [("D1:1",), ("D1:5",)]
    assert conversations_find(DATA) == [DATA / "tiny.json"]
    with pytest.raises(FileNotFoundError):
        conversations_find(DATA, ["nope"])


def test_the_whole_conversation_holds_every_questions_evidence(tiny: Conversation) -> None:
    for question in tiny.questions:
        haystack = payload_haystack(_payload(tiny, question.question), question=question.question)
        assert question_covered(haystack=haystack, question=question, turns=tiny.turns)


def test_a_missing_evidence_turn_fails_its_question_only(tiny: Conversation) -> None:
    gone = tiny.turns["D1:5"].text
    ask = tiny.questions[1]
    messages = _payload(tiny, ask.question)
    for message in messages:
        message["content"] = message["content"].replace(gone, "(that turn was dropped)")
    haystack = payload_haystack(messages, question=ask.question)
    covered = [
        question_covered(haystack=haystack, question=q, turns=tiny.turns) for q in tiny.questions
    ]
    assert covered == [True, False, True, True, True]
    # One of two evidence turns is not enough.
    two = tiny.questions[2]
    without = _payload(tiny, two.question)
    for message in without:
        message["content"] = message["content"].replace(tiny.turns["D3:1"].text, "It shipped.")
    haystack = payload_haystack(without, question=two.question)
    assert not question_covered(haystack=haystack, question=two, turns=tiny.turns)


def test_the_longest_sentence_counts_and_quotes_and_spacing_do_not_matter() -> None:
    turn = "Yes, a blue pair from Stride & Co. They cost 120 euros but they feel great."
    assert longest_sentence(turn) == "They cost 120 euros but they feel great."
    summary = "## Facts\n- Ben: They cost 120 euros  but they\nfeel great."
    assert evidence_present(
        haystack=payload_haystack([{"content": summary}], question="?"), text=turn
    )
    other = "- Yes, a blue pair from Stride & Co."
    assert not evidence_present(
        haystack=payload_haystack([{"content": other}], question="?"), text=turn
    )
    quoted = (
        "[recalled, 2024-03-03]\n> Yes, a blue pair from Stride & Co.\n"
        "> They cost 120 euros\n> but they feel great."
    )
    assert evidence_present(
        haystack=payload_haystack([{"content": quoted}], question="?"), text=turn
    )


def test_the_question_itself_is_not_searched() -> None:
    turn = "Her name is Pepper and she is four years old."
    asked = f"Someone said: {turn} What is the cat called?"
    messages = [{"role": "system", "content": "Hi"}, {"role": "user", "content": asked}]
    assert not evidence_present(haystack=payload_haystack(messages, question=asked), text=turn)
    # What else the question's message carries (recall placed there) still counts.
    messages[-1]["content"] = f"> {turn}\n\n{asked}"
    assert evidence_present(haystack=payload_haystack(messages, question=asked), text=turn)


def test_the_plan_has_one_truncation_and_one_whole_run_per_budget() -> None:
    plan = configs_plan(
        modes=["truncation", "cadau", "whole"],
        summaries=["unusable", "good"],
        budgets=[48000, 16000],
    )
    assert [(c.mode, c.summaries, c.budget) for c in plan] == [
        ("truncation", "fail", 48000),
        ("cadau", "unusable", 48000),
        ("cadau", "good", 48000),
        ("truncation", "fail", 16000),
        ("cadau", "unusable", 16000),
        ("cadau", "good", 16000),
        ("whole", "unusable", 2_000_000),
    ]
    with pytest.raises(ValueError):
        configs_plan(modes=["clever"], summaries=["good"], budgets=[1000])


def test_an_embedding_server_turns_on_semantic_recall_in_cadaus_runs_only(tmp_path: Path) -> None:
    url = "http://127.0.0.1:8765/v1"
    plan = configs_plan(
        modes=["truncation", "seed", "cadau"], summaries=["good"], budgets=[1000], embeddings=url
    )
    envs = {c.mode: c.env(db=tmp_path / "db", fake_url="http://127.0.0.1:1") for c in plan}
    assert envs["cadau"]["LLM_EMBEDDING_BASE_URL"] == url
    assert envs["cadau"]["LLM_EMBEDDING_MODEL"]
    assert "LLM_EMBEDDING_MODEL" not in envs["seed"]
    assert "LLM_EMBEDDING_MODEL" not in envs["truncation"]
    assert [c.label for c in plan if c.mode == "cadau"] == ["Cadau + embeddings, good summaries"]


def test_a_real_replay_through_the_server(
    tiny: Conversation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The servers take their settings from the environment: a summary cap that fits a
    # 1,000-rune budget (the shipped 6,000 would outgrow it).
    monkeypatch.setenv("CHAT_CONTEXT_SUMMARY_MAX_RUNES", "300")
    plan = [
        Config(mode="cadau", summaries="unusable", budget=1000),
        Config(mode="whole", summaries="unusable", budget=2_000_000),
    ]
    results = measure(convs=[tiny], plan=plan, folder=tmp_path)
    small, whole = results
    for result in results:
        assert result["failed_sends"] == [], result["failed_sends"]
        assert result["exchanges"] == len(tiny.exchanges)
        assert result["over_budget"] == 0
        assert [c for c, _ok, _r in result["questions"]] == [4, 2, 1, 4, 3]
    assert all(ok for _c, ok, _r in whole["questions"])
    assert whole["replay_summary_calls"] == 0
    # The whole conversation and the questions reached the model: everything it said.
    assert whole["max_payload_runes"] > tiny.runes
    # 1,000 runes cannot hold it: Cadau summarised (the model's summaries unusable) and sent less.
    assert small["replay_summary_calls"] > 0
    assert 0 < small["max_payload_runes"] <= 1000
    section = render(results=results, convs=[tiny], command="test", wall_seconds=1.0, quick=False)
    assert "| whole conversation (no limit) | 100% | 100% |" in section


def test_merged_results_replace_the_runs_they_repeat() -> None:
    def run(conv: str, budget: int, share: bool, quick: bool = False) -> dict[str, Any]:
        config = {"mode": "cadau", "summaries": "unusable", "budget": budget}
        return {
            "conversation": conv,
            "config": config,
            "questions": [(4, share, 1)],
            "quick": quick,
        }

    earlier = [run("26", 48000, False), run("30", 48000, False), run("26", 16000, False)]
    earlier.append(run("41", 48000, False, quick=True))
    merged = results_merge(earlier=earlier, new=[run("30", 48000, True), run("42", 48000, True)])
    assert [(r["conversation"], r["config"]["budget"], r["questions"][0][1]) for r in merged] == [
        ("26", 48000, False),
        ("26", 16000, False),
        ("30", 48000, True),
        ("42", 48000, True),
    ]
