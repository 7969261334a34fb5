"""`python -m bench ttft`'s results and their report (bench/ttft.py measures them)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.report import pct
from bench.ttft_steps import STEPS, STEPS_SENDS

# Targets (the issue): Cadau adds at most this much to the model's own time to first token.
TARGET_P50_MS = 10.0
TARGET_P95_MS = 20.0
TARGET_RATIO = 1.2  # the largest session against a fresh one
# The fake model's reply: the figures are the time to its first token.
REPLY_WORDS = 20


@dataclass(kw_only=True)
class DbRun:
    label: str
    version: str = ""
    note: str = ""
    # (kind, transport) -> first-delta times, ms; and the model's own for the same payloads
    cells: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    model: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    waited: int = 0  # sends that waited on a summarising call
    sends: int = 0
    inside: dict[str, Any] = field(default_factory=dict)
    # Of the "imported, compacting" sends: how many the compaction was still committing during.
    compacting_overlapped: int = 0
    compacting_sent: int = 0
    # kind -> step -> median ms after sending (bench/ttft_steps.py)
    steps: dict[str, dict[str, float]] = field(default_factory=dict)


def _f(ms: float) -> str:
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _inside_rows(run: DbRun, kinds: list[str]) -> list[str]:
    lines = [
        "| session | queries before the first token | queries per send | rows read per send "
        "| checks, store and prepare ms | of which prepare ms | model's first chunk ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in kinds:
        data = run.inside.get(kind)
        if not data:
            continue
        runs = data["runs"]
        spans = data["spans"]

        def med(values: list[Any]) -> str:
            values = [v for v in values if v is not None]
            return _f(statistics.median(values)) if values else "-"

        lines.append(
            f"| {kind} | {med([r['queries_before_first_token'] for r in runs])} "
            f"| {med([r['queries'] for r in runs])} | {med([r['rows_read'] for r in runs])} "
            f"| {med(spans.get('checks, store and prepare', []))} "
            f"| {med(spans.get('prepare: hooks, tail read, payload', []))} "
            f"| {med(data['model_first_chunk_ms'])} |"
        )
    return lines


def _steps_lines(run: DbRun) -> list[str]:
    """Each step of a REST send: when it was reached after sending, and what it took since
    the step before, per kind of session."""
    kinds = list(run.steps)
    lines = [
        "| step | " + " | ".join(f"{k}: at ms | {k}: took ms" for k in kinds) + " |",
        "| --- |" + " ---: | ---: |" * len(kinds),
    ]
    before = dict.fromkeys(kinds, 0.0)  # the last step each kind reached
    for name, what in [*STEPS, ("received", "first delta at the client")]:
        cells = []
        for kind in kinds:
            at = run.steps[kind].get(name)
            if at is None:
                cells += ["-", "-"]
                continue
            cells += [_f(at), _f(at - before[kind])]
            before[kind] = at
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return lines


def ttft_render(*, runs: list[DbRun], args: Any, command: str) -> str:
    lines = _intro_lines(runs=runs, args=args, command=command)
    for run in runs:
        lines += [f"### {run.label}", ""]
        if run.note:
            lines += [run.note, ""]
            continue
        lines += _cell_lines(run)
        sizes = sorted({int(k) for k, _ in run.cells if k.isdigit()})
        if sizes:
            lines += _ratio_lines(run, largest=str(sizes[-1]))
        if run.compacting_sent:
            lines += [
                "",
                f"*imported, compacting*: {run.compacting_overlapped} of {run.compacting_sent} "
                "second sends went out while the first compaction was still committing (a "
                "chunk committed after they started); only those are in the cell.",
            ]
        lines += [
            "",
            f"Sends that waited on a summarising call: **{run.waited} of {run.sends}** "
            "(the `summary_calls_waited` of every reply, imported sessions included).",
            "",
            "Inside the server (the same sends through the real view in one process, 10 per "
            "session, medians; queries counted on every thread's connection):",
            "",
        ]
        kinds = ["fresh", *[str(s) for s in sizes]]
        lines += [*_inside_rows(run, kinds), ""]
        if run.steps:
            lines += [
                f"Step by step (REST SSE, {STEPS_SENDS} sends per session after 2 untimed "
                "rounds, through the server with a timestamp at each step, "
                "`bench/ttft_steps.py`; medians, ms after the client sent the request; a step's "
                "*took* is the difference of two medians):",
                "",
                *_steps_lines(run),
                "",
            ]
    return "\n".join(lines)


def _intro_lines(*, runs: list[DbRun], args: Any, command: str) -> list[str]:
    """The heading, what was measured on, how to rerun it and how the figures are taken."""
    lines = ["## Time to first token: what Cadau adds to the model's", ""]
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} "
        f"CPU(s), Python {platform.python_version()}, "
        + ", ".join(r.version for r in runs if r.version)
        + "."
    )
    lines += [
        "",
        "```sh",
        f"{command}   # this section (`make bench BENCH_ARGS=ttft`)",
        "python -m bench ttft --ttft-sizes 1000,100000 --ttft-databases sqlite   # quicker",
        "```",
        "",
        "How: the app under Daphne as `make run` serves it (`python -m cadau.serve`, "
        "`DEBUG=false`, default settings: background compaction on, `DB_CONN_MAX_AGE=60`) on a "
        "loopback port, the fake model in its own process (no pacing, "
        f"{REPLY_WORDS}-word replies). One client sends one message at a time and notes the "
        "time from sending to the first `delta`: over REST (`POST /api/v1/chat/send`, "
        "`Accept: text/event-stream`, token auth) and over a WebSocket opened beforehand. "
        "*model*: the same client asking the fake model directly, right after each send, for a "
        "stream of a payload as large as that send's, time to the first token. Sessions: "
        "*fresh* (a new one per send), and seed_demo sessions of N messages with a full "
        "summary (6,000 characters, the default cap) and the last 40 messages verbatim. "
        f"{args.ttft_sends} timed sends per cell after 2 untimed rounds, round-robin over the "
        "cells. *imported*: a 100,000-message session with no summary at all, as seed_demo or "
        "an import leaves it, put back in that state before each of its sends (each is a "
        "first send, right after an untimed send to a fresh session, as the server idled "
        "while the last compaction settled; its *model* figure is taken once the compaction "
        "that send started has ended, as its summarising calls go to the same model server). "
        "*N, recalling*: the largest session, asked after an old turn by a rare term "
        '("what did I have at step 118 ...", a new three-digit number each send, which '
        "seed_demo's pasted code holds in ~100 of a million messages): recall looks it up below "
        "its window and reads its matches' neighbours, before the first token. "
        '*N, asking for a kind*: the largest session asked "which databases did we use ...", '
        "a new kind each send (chat/search/concepts.py): recall looks for the kind's WordNet "
        "members in its window, before the first token. "
        "*imported, opened first*: the same first send, the chat opened 0.3 s before it as its "
        "page opens it (the history's newest page: recall's window is read then, in the "
        "background). "
        "*imported, compacting*: a second send to it, as soon as the first one's reply is "
        "done, while the compaction the first started commits chunk after chunk (its *model* "
        "figure also taken once that compaction ended). "
        "*added* = the cell's "
        "percentile minus the model's. All processes share the machine's 2 cores.",
        "",
    ]
    return lines


def _cell_lines(run: DbRun) -> list[str]:
    """One engine's table: every (session, transport) cell against the model's own time."""
    lines = [
        "| session | transport | sends | model p50 / p95 ms | Cadau p50 ms | p95 ms "
        "| p99 ms | added p50 | added p95 | target met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (kind, transport), values in run.cells.items():
        model = run.model[(kind, transport)]
        added50 = pct(values, 50) - pct(model, 50)
        added95 = pct(values, 95) - pct(model, 95)
        met = added50 <= TARGET_P50_MS and added95 <= TARGET_P95_MS
        lines.append(
            f"| {kind} | {transport} | {len(values)} "
            f"| {_f(pct(model, 50))} / {_f(pct(model, 95))} | {_f(pct(values, 50))} "
            f"| {_f(pct(values, 95))} | {_f(pct(values, 99))} | {_f(added50)} "
            f"| {_f(added95)} | {'yes' if met else '**no**'} |"
        )
    return lines


def _ratio_lines(run: DbRun, *, largest: str) -> list[str]:
    """The largest session's p50 and p95 against a fresh one's, per transport."""
    lines = ["", f"The {int(largest):,}-message session against a fresh one:", ""]
    for transport in ("REST SSE", "WebSocket"):
        big, fresh = run.cells[(largest, transport)], run.cells[("fresh", transport)]
        r50 = pct(big, 50) / pct(fresh, 50)
        r95 = pct(big, 95) / pct(fresh, 95)
        met = r50 <= TARGET_RATIO and r95 <= TARGET_RATIO
        lines.append(
            f"- {transport}: p50 {r50:.2f}x, p95 {r95:.2f}x "
            f"(target <= {TARGET_RATIO}x: {'met' if met else '**not met**'})"
        )
    return lines
