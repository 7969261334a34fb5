"""`python -m bench context`: the rolling summary, seed's loop against ours, same conversation.

Figures (issue 3): summarising calls (ours <= 1/5 of the seed's), sends that wait on a
summarising call (ours <= 1 in 10), rows read per send (ours: the verbatim tail; the seed: up to
8000), and server time added to a send with no compaction, 10 vs 100k messages (within 1.2x).

Each run is a child process (`bench.context_worker`) with its own settings and a fresh SQLite
database under .bench/, talking to a fake LLM server child process over loopback HTTP."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ServerProcess, app_env, worker_run

ROOT = Path(__file__).resolve().parent.parent
# The shipped defaults, spelled out so the table says what ran. Both strategies get the same.
KNOBS = {
    "CHAT_CONTEXT_INPUT_BUDGET_RUNES": "48000",
    "CHAT_CONTEXT_THRESHOLD_PCT": "88",
    "CHAT_CONTEXT_TARGET_PCT": "60",
    "CHAT_CONTEXT_ROLL_BATCH": "4",
    "CHAT_CONTEXT_MIN_VERBATIM": "4",
    "CHAT_CONTEXT_SUMMARY_MAX_RUNES": "6000",
    "CHAT_CONTEXT_HISTORY_READ_LIMIT": "8000",
    "CHAT_CONTEXT_MAX_ROUNDS": "48",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("context")
    group.add_argument("--context-turns", type=int, default=500)
    group.add_argument("--context-sizes", default="10,100000")
    group.add_argument("--context-sends", type=int, default=40)
    group.add_argument("--context-imported", type=int, default=10_000, help="0: skip")
    group.add_argument("--context-imported-sends", type=int, default=6)


def _env(*, db: Path, fake_url: str, strategy: str) -> dict[str, str]:
    return app_env(
        f"sqlite:///{db}",
        keep_redis=True,
        **KNOBS,
        CHAT_CONTEXT_STRATEGY=strategy,
        LLM_BASE_URL=f"{fake_url}/v1",
        LLM_MODEL="fake-chat",
        LLM_API_KEY="bench",
        FAKE_LLM_URL=fake_url,
    )


def _fake_llm_reset(fake: ServerProcess) -> None:
    httpx.post(f"{fake.url}/_control/reset", timeout=5).raise_for_status()
    httpx.post(f"{fake.url}/_control/config", json={"reply_words": 60}, timeout=5)


def _worker(args: list[str], env: dict[str, str]) -> Any:
    return worker_run("bench.context_worker", *args, env=env)


def _fresh_db(name: str) -> Path:
    folder = ROOT / ".bench"
    folder.mkdir(exist_ok=True)
    path = folder / f"context-{name}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def run(*, args: Any, command: str) -> str:
    fake = ServerProcess.fake_llm(
        env=dict(os.environ), log_path=ROOT / ".bench" / "context-fakellm.log", reply_words=60
    )
    fake.wait_ready(path="/_control/health", timeout=30)
    try:
        conv: dict[str, Any] = {}
        for strategy in ("seed", "cadau"):
            _fake_llm_reset(fake)
            print(f"[context] {args.context_turns} turns, strategy={strategy}", flush=True)
            conv[strategy] = _worker(
                ["conversation", "--turns", str(args.context_turns)],
                _env(db=_fresh_db(strategy), fake_url=fake.url, strategy=strategy),
            )
        lat: dict[str, Any] = {}
        for strategy in ("cadau", "seed"):
            print(f"[context] send latency {args.context_sizes}, strategy={strategy}", flush=True)
            env = _env(db=_fresh_db(f"latency-{strategy}"), fake_url=fake.url, strategy=strategy)
            # A large budget: the probe measures a send that needs no compaction.
            env["CHAT_CONTEXT_INPUT_BUDGET_RUNES"] = "200000"
            lat[strategy] = _worker(
                ["latency", "--sizes", args.context_sizes, "--sends", str(args.context_sends)], env
            )
        imported: dict[str, Any] = {}
        # An import's first sends, with recall (the default) and without it (how it was before
        # recall: the whole history folded into the summary).
        for recall in ("true", "false") if args.context_imported else ():
            _fake_llm_reset(fake)
            print(f"[context] imported {args.context_imported}, recall={recall}", flush=True)
            env = _env(db=_fresh_db(f"imported-{recall}"), fake_url=fake.url, strategy="cadau")
            env["CHAT_CONTEXT_RECALL"] = recall
            imported[recall] = _worker(
                [
                    "imported",
                    "--sizes",
                    str(args.context_imported),
                    "--sends",
                    str(args.context_imported_sends),
                ],
                env,
            )
    finally:
        fake.stop()
    return _render(conv=conv, lat=lat, args=args, command=command) + _render_imported(
        imported=imported
    )


def _render_imported(*, imported: dict[str, Any]) -> str:
    if not imported:
        return ""
    size = imported["true"]["size"]
    lines = [
        "",
        f"An imported session ({size:,} messages made by seed_demo, no summary): its first "
        f"{imported['true']['sends']} sends through the same path, each followed by the "
        "background compaction it started. *Steady*: no backlog left and a send that started "
        "no compaction. Recall off is how Cadau compacted an import before recall carried old "
        "material (the whole history folded into the summary).",
        "",
        "| recall | summarising calls before steady | steady after sends | calls per send "
        "| prompt runes per call (mean / max) | target |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for recall in ("true", "false"):
        r = imported.get(recall)
        if r is None:
            continue
        before = r["calls_before_steady"]
        lines.append(
            f"| {'on (default)' if recall == 'true' else 'off (before)'} | "
            f"{before if before is not None else 'not steady'} | "
            f"{r['steady_after_sends'] if r['steady_after_sends'] is not None else '-'} | "
            f"{', '.join(str(n) for n in r['calls_per_send'])} | "
            f"{r['prompt_runes_mean']:,.0f} / {r['prompt_runes_max']:,} | "
            f"{'<= 8' if recall == 'true' else ''} |"
        )
    return "\n".join(lines) + "\n"


def _render(*, conv: dict[str, Any], lat: dict[str, Any], args: Any, command: str) -> str:
    seed, ours = conv["seed"], conv["cadau"]
    ratio = ours["summary_calls"] / seed["summary_calls"] if seed["summary_calls"] else 0.0
    knobs = ", ".join(f"{k.removeprefix('CHAT_CONTEXT_').lower()}={v}" for k, v in KNOBS.items())
    lines = [
        "## Rolling summary: the seed's loop against ours",
        "",
        f"`{command}` · {args.context_turns} scripted turns through the real send path "
        "(turn_open + TurnRun.result, fake LLM server over loopback HTTP, replies of 60 words), "
        f"SQLite, knobs: {knobs}. Background compaction is awaited between turns (it runs "
        "while the user types).",
        "",
        "| figure | seed mode | ours (cadau) | target |",
        "| --- | ---: | ---: | --- |",
        f"| summarising calls | {seed['summary_calls']} | {ours['summary_calls']} "
        f"({ratio:.2f}x) | ours <= 0.20x |",
        f"| sends that waited on a summary | {seed['sends_waiting']} / {seed['turns']} | "
        f"{ours['sends_waiting']} / {ours['turns']} | ours <= 1 in 10 |",
        f"| rows read per send (mean / max / last) | {seed['rows_read_mean']:.0f} / "
        f"{seed['rows_read_max']} / {seed['rows_read_last']} | {ours['rows_read_mean']:.0f} / "
        f"{ours['rows_read_max']} / {ours['rows_read_last']} | constant (the tail) |",
        f"| send server time p50 (ms, incl. fake LLM) | {seed['send_ms_p50']:.1f} | "
        f"{ours['send_ms_p50']:.1f} | |",
        "",
        "Server time of a send that needs no compaction (fake LLM answering at once), by "
        f"session length; {args.context_sends} sends each, summary + 10-message verbatim tail:",
        "",
        "| messages in session | ours p50 / p95 ms | ours rows read "
        "| seed p50 / p95 ms | seed rows read |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in args.context_sizes.split(","):
        o, s = lat["cadau"][size], lat["seed"][size]
        lines.append(
            f"| {int(size):,} | {o['p50_ms']:.1f} / {o['p95_ms']:.1f} | {o['rows_read']} | "
            f"{s['p50_ms']:.1f} / {s['p95_ms']:.1f} | {s['rows_read']} |"
        )
    sizes = args.context_sizes.split(",")
    growth = lat["cadau"][sizes[-1]]["p50_ms"] / lat["cadau"][sizes[0]]["p50_ms"]
    lines += ["", f"Ours, largest vs smallest session p50: {growth:.2f}x (target <= 1.2x)."]
    return "\n".join(lines) + "\n"
