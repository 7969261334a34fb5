"""`python -m bench realmodel`: Cadau against a real model server (llama-cpp-python serving
SmolLM2-135M-Instruct at n_ctx 1024, from the `realllm` extra) under the default 48,000-rune
budget: long English and Chinese conversations that outgrow the model's window many times.
Reports the reply success rate, sends that waited on a summary, summaries accepted or replaced
by the extractive fallback, and the characters per token the provider's usage shows for each
language. Slow: a CPU model reads ~50 tokens a second."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procs import NO_LIMITS, ROOT, ServerProcess, free_port
from devtools.realllm import (
    REAL_LLM_MODEL,
    REAL_LLM_N_CTX,
    real_llm_skip_reason,
    server_argv,
    server_env,
    smollm2_model_path,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("realmodel")
    group.add_argument(
        "--realmodel-sends", type=int, default=10, help="sends per language (default 10)"
    )


def _log(message: str) -> None:
    print(f"[realmodel] {message}", file=sys.stderr, flush=True)


def _worker(*, llm_url: str, sends: int, database: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        **NO_LIMITS,
        "DATABASE_URL": f"sqlite:///{database}",
        "LLM_BASE_URL": llm_url,
        "LLM_MODEL": REAL_LLM_MODEL,
        "LLM_SUMMARY_MODEL": REAL_LLM_MODEL,
        "LLM_SERVER_SLOTS": "1",
        "REDIS_URL": "",
    }
    out = subprocess.run(
        [sys.executable, "-m", "bench.realmodel_worker", "--sends", str(sends)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _factors(found: dict[str, float]) -> str:
    parts = []
    if "other" in found:
        parts.append(f"English {found['other']:.2f} ({3 / found['other']:.1f} characters a token)")
    if "cjk" in found:
        parts.append(f"Chinese {found['cjk']:.2f} ({2 * found['cjk']:.2f} tokens a character)")
    return ", ".join(parts) or "none (no usage reported)"


def _render(*, data: dict[str, Any], seconds: float, command: str) -> str:
    rows = []
    for lang, label in (("en", "English"), ("zh", "Chinese"), ("mixed", "mixed")):
        conv = data["conversations"][lang]
        replies = conv["replies"]
        ok = sum(r["ok"] for r in replies)
        waited = sum(1 for r in replies if r["waited"])
        cut = sum(1 for r in replies if r["cut"])
        snaps = [s for s in data["snapshots"] if s["session_id"] == conv["session_id"]]
        accepted = sum(
            1 for s in snaps if s["outcome"] == "committed" and s["model"] != "extractive-fallback"
        )
        fallback = sum(1 for s in snaps if s["model"] == "extractive-fallback")
        failed = sum(1 for s in snaps if s["outcome"] in ("failed", "rejected"))
        seconds_p50 = sorted(r["seconds"] for r in replies)[len(replies) // 2]
        rows.append(
            f"| {label} | {ok}/{len(replies)} | {conv['stored_user_messages']}/{len(replies)} "
            f"| {waited} | {cut} | {accepted} | {fallback} | {failed} | {seconds_p50} |"
        )
    return "\n".join(
        [
            "## Real model server",
            "",
            f"`{command}` — llama-cpp-python serving SmolLM2-135M-Instruct (Q4_1) at "
            f"`--n_ctx {REAL_LLM_N_CTX}`, its defaults otherwise (one request at a time); Cadau "
            "with the default 48,000-rune budget, background compaction on, "
            "`LLM_SERVER_SLOTS=1`, SQLite. Each send is a long message (~900 characters of "
            "English, ~110 of Chinese; *mixed* turns English, Chinese, both in one message, "
            "and ~220 characters of Chinese in turn): the conversation outgrows the model's "
            f"window every few turns. Whole run: {seconds:.0f} s.",
            "",
            "| conversation | replies complete | messages stored | sends that waited on a "
            "summary | replies cut | summaries accepted | summaries by the fallback | "
            "compactions failed | seconds per send p50 |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Window learned: {data['window_learned']} tokens (the server runs {REAL_LLM_N_CTX}); "
            "token-estimate factors learned from the summary calls' usage (applied with a 10% "
            f"margin; 1.0 = the default guess of 3 characters per token, 2 tokens per CJK "
            f"character): {_factors(data['tokens_factors'])}.",
        ]
    )


def run(*, args: Any, command: str) -> str:
    reason = real_llm_skip_reason()
    if reason:
        raise SystemExit(reason)
    model_path = smollm2_model_path()
    assert model_path is not None
    port = free_port()
    started = time.monotonic()
    server = ServerProcess(
        argv=server_argv(model_path=model_path, port=port, n_ctx=REAL_LLM_N_CTX),
        port=port,
        env=server_env(),
        log_path=ROOT / "artifacts" / "bench-real-llm.log",
    )
    with server, tempfile.TemporaryDirectory() as tmp:
        server.wait_ready(path="/v1/models", timeout=120)
        _log(f"model server up in {time.monotonic() - started:.1f} s; sending")
        data = _worker(
            llm_url=f"{server.url}/v1", sends=args.realmodel_sends, database=Path(tmp) / "db"
        )
    # Every send's outcome, for reading past the table.
    raw = ROOT / "artifacts" / "bench-realmodel.json"
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps(data, indent=1))
    return _render(data=data, seconds=time.monotonic() - started, command=command)
