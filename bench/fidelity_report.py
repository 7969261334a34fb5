"""The markdown section `python -m bench fidelity` writes into docs/benchmarks.md: the method,
then the share of questions whose evidence reached the model, by configuration and
conversation, by category, and the details of each run."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from bench.fidelity_data import CATEGORIES, Conversation

METHOD = """\
**Data.** LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM
Agents", ACL 2024): very long two-person conversations, each question annotated with the
dialogue turns that answer it (its evidence). Questions of categories 1-4 (multi-hop, temporal,
open-domain, single-hop); category 5 (adversarial) has no evidence. The files are read from
`../shared/data/locomo/` (or `--data DIR`), never copied into the repository.

**Replay.** For each conversation and configuration: a fresh database, a real server process
(Daphne, `python -m cadau.serve`), real HTTP. Every turn of speaker A is a send (`POST
/api/v1/chat/send`); the fake model server (devtools/fakellm), scripted just before each send,
answers with speaker B's next turns. Consecutive turns of one speaker are one message; a shared
photo is its caption, "[shares a photo: ...]". Between sends the driver waits for the server's
background jobs (a background compaction finishes while a person types).

**Questions.** Each question is a send against the same replayed conversation: sent, its
payload read from the fake server's recorded calls (`/_control/calls`), then taken back with
`POST /api/v1/chat/truncate` (the API's edit and resend) before the next one. A question
counts when **every** evidence turn is in the payload verbatim, or at least the turn's longest
sentence (whitespace normalised, the "> " recall puts before quoted lines read past; the
question itself is not searched). Only the HTTP API and the recorded calls are read, never the
engine's internals.

**Configurations.** *truncation*: every summary call fails (HTTP 500), so Cadau can only drop
old turns. *seed's loop*: `CHAT_CONTEXT_STRATEGY=seed`. *Cadau default*: shipped settings.
*whole conversation*: a budget larger than any conversation, the check of the scorer (must be
100%). Summaries: *unusable* (the model echoes its request; the guard rejects it and Cadau
falls back to its extractive summary), *vague* (short, accepted, no facts: "The two friends
caught up about their lives and plans."), *good* (the previous summary kept and the
transcript's sentences that carry names, numbers, dates and first-person statements copied,
the most informative first, within the asked length). Budgets: `CHAT_CONTEXT_INPUT_BUDGET_RUNES`.
Other settings are the environment's (e.g. `CHAT_CONTEXT_RECALL=true python -m bench fidelity`);
titles are off and `LLM_MAX_RETRIES=0` (the fake never fails a chat call).

"All" pools the questions of the conversations measured in that row (a "-" is a conversation
not measured in that configuration). "Runes sent" are the question payloads' runes (all
messages' text); "over budget" counts every
chat payload of the run, replay included, over its budget (must be 0); "summarising calls" are
the summary-model calls during the replay (and, in the details, while the questions were asked).
"""


def _share(rows: Iterable[tuple[int, bool, int]]) -> tuple[float, int]:
    rows = list(rows)
    return (100.0 * sum(1 for _c, ok, _r in rows if ok) / len(rows) if rows else 0.0), len(rows)


def _pct(rows: Iterable[tuple[int, bool, int]]) -> str:
    share, n = _share(rows)
    return f"{share:.0f}%" if n else "-"


def _runes(rows: list[tuple[int, bool, int]]) -> str:
    sizes = [r for _c, _ok, r in rows if r]
    if not sizes:
        return "-"
    return f"{max(sizes):,} / {statistics.mean(sizes):,.0f}"


def _key(result: dict[str, Any]) -> tuple[str, str, int]:
    config = result["config"]
    return config["mode"], config["summaries"], config["budget"]


def _budget_table(
    results: list[dict[str, Any]], *, budget: int, convs: list[Conversation]
) -> list[str]:
    names = [c.name for c in convs]
    lines = [
        f"### Budget {budget:,} runes: questions with all their evidence in the payload",
        "",
        f"| configuration | {' | '.join(names)} | all | runes sent (max / mean) "
        "| over budget | summarising calls (replay) |",
        f"| --- | {' | '.join('---:' for _ in names)} | ---: | ---: | ---: | ---: |",
    ]
    keys = list(dict.fromkeys(_key(r) for r in results if r["config"]["budget"] == budget))
    keys += list(dict.fromkeys(_key(r) for r in results if r["config"]["mode"] == "whole"))
    for key in keys:
        runs = [r for r in results if _key(r) == key]
        by_conv = {r["conversation"]: r for r in runs}
        cells = [_pct(by_conv[n]["questions"]) if n in by_conv else "-" for n in names]
        pooled = [q for r in runs for q in r["questions"]]
        calls = " / ".join(str(by_conv[n]["replay_summary_calls"]) for n in names if n in by_conv)
        over = sum(r["over_budget"] for r in runs)
        lines.append(
            f"| {runs[0]['label']} | {' | '.join(cells)} | {_pct(pooled)} | {_runes(pooled)} "
            f"| {over} | {calls} |"
        )
    return [*lines, ""]


def _category_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "### By category (all conversations pooled)",
        "",
        f"| configuration | budget | {' | '.join(CATEGORIES.values())} |",
        f"| --- | ---: | {' | '.join('---:' for _ in CATEGORIES)} |",
    ]
    for key in dict.fromkeys(_key(r) for r in results):
        runs = [r for r in results if _key(r) == key]
        pooled = [q for r in runs for q in r["questions"]]
        cells = []
        for category in CATEGORIES:
            rows = [q for q in pooled if q[0] == category]
            cells.append(f"{_pct(rows)} ({len(rows)})" if rows else "-")
        budget = "-" if key[0] == "whole" else f"{key[2]:,}"
        lines.append(f"| {runs[0]['label']} | {budget} | {' | '.join(cells)} |")
    return [*lines, ""]


def _details_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "### Each run",
        "",
        "| conversation | configuration | budget | questions | all evidence | runes sent "
        "(max / mean) | largest payload | over budget | summarising calls (replay / questions) "
        "| summaries rewound | failed sends | seconds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        budget = "-" if r["config"]["mode"] == "whole" else f"{r['config']['budget']:,}"
        lines.append(
            f"| {r['conversation']} | {r['label']} | {budget} | {len(r['questions'])} "
            f"| {_pct(r['questions'])} | {_runes(r['questions'])} | {r['max_payload_runes']:,} "
            f"| {r['over_budget']} | {r['replay_summary_calls']} / {r['question_summary_calls']} "
            f"| {r['summaries_rewound']} | {len(r['failed_sends'])} | {r['seconds']:.0f} |"
        )
    failures = [(r, f) for r in results for f in r["failed_sends"]][:10]
    if failures:
        lines += ["", "Failed sends (first 10):", ""]
        lines += [f"- {r['conversation']} {r['label']}: {f}" for r, f in failures]
    return [*lines, ""]


def render(
    *,
    results: list[dict[str, Any]],
    convs: list[Conversation],
    command: str,
    wall_seconds: float,
    quick: bool,
    start_seconds: float = 0.0,
    merged: int = 0,
) -> str:
    budgets = list(
        dict.fromkeys(r["config"]["budget"] for r in results if r["config"]["mode"] != "whole")
    )
    sizes = ", ".join(
        f"{c.name}: {sum(len(e.dia_ids) for e in c.exchanges)} turns in {len(c.exchanges)} "
        f"sends, {c.runes:,} runes, {len(c.questions)} questions"
        + (f" ({c.unscorable} without usable evidence left out)" if c.unscorable else "")
        for c in convs
    )
    lines = [
        "## Context fidelity: LoCoMo evidence in the payload",
        "",
        f"`{command}` · {'quick run (first turns and questions only) · ' if quick else ''}"
        f"wall time {wall_seconds / 60:.1f} min ({len(results) - merged} runs, of which "
        f"{start_seconds / 60:.1f} min starting servers)"
        + (f", shown with {merged} runs measured earlier (`--fidelity-merge`)" if merged else "")
        + f" · {sizes}.",
        "",
        METHOD,
    ]
    for budget in budgets:
        lines += _budget_table(results, budget=budget, convs=convs)
    if not budgets:
        lines += _budget_table(results, budget=-1, convs=convs)
    lines += _category_table(results)
    lines += _details_table(results)
    return "\n".join(lines)
