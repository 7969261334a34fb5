"""`python -m bench fidelity`: does the payload the model is sent keep what the conversation
said? LoCoMo conversations (Maharana et al., ACL 2024) replayed through a real Cadau server,
then every category 1-4 question asked and the model's payload checked for its evidence turns.

Each conversation under each configuration gets a fresh SQLite database (a copy of one migrated
template) and its own server process (Daphne, `python -m cadau.serve`, bench.urls), driven over
HTTP (bench/fidelity_run.py); one fake model server (devtools/fakellm) serves the whole run,
reset and reconfigured for each. The replay, the questions and the scorer are in
bench/fidelity_data.py. Results: a table per budget, per category, and the details; the raw
numbers also in .bench/fidelity-results.json."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.fidelity_data import Conversation, conversation_cut, conversation_load
from bench.fidelity_data import conversations_find as _find
from bench.fidelity_report import render
from bench.fidelity_run import PASSWORD, USERNAME, Outcome, conversation_run
from bench.procs import ServerProcess, app_env

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
MODES = ("truncation", "seed", "cadau", "whole")
SUMMARIES = ("unusable", "vague", "good")
# Larger than any conversation with its questions: nothing is ever compacted.
WHOLE_BUDGET = 2_000_000
QUICK_TURNS, QUICK_QUESTIONS = 120, 20


@dataclass(frozen=True, slots=True)
class Config:
    mode: str
    #: The fake's summary_style: "fail" for truncation, else the summary quality.
    summaries: str
    budget: int
    #: An OpenAI-compatible server's /v1 URL: Cadau's semantic recall embeds with it.
    embeddings: str = ""

    @property
    def label(self) -> str:
        if self.mode == "whole":
            return "whole conversation (no limit)"
        if self.mode == "truncation":
            return "truncation (every summary call fails)"
        name = "seed's loop" if self.mode == "seed" else "Cadau default"
        if self.embeddings:
            name = "Cadau + embeddings"
        return f"{name}, {self.summaries} summaries"

    def env(self, *, db: Path, fake_url: str) -> dict[str, str]:
        env = app_env(f"sqlite:///{db}", keep_redis=False, **_APP)
        # The model is the fake: whatever the caller's environment names is left out.
        for key in [k for k in env if k.startswith("LLM_")]:
            del env[key]
        env.update(LLM_BASE_URL=f"{fake_url}/v1", LLM_MODEL="fake-chat", LLM_API_KEY="bench")
        env.update(LLM_SUMMARY_MODEL="fake-summary", LLM_MAX_RETRIES="0")
        env["CHAT_CONTEXT_INPUT_BUDGET_RUNES"] = str(self.budget)
        env["CHAT_CONTEXT_STRATEGY"] = "seed" if self.mode == "seed" else "cadau"
        if self.mode == "truncation":
            # Plain truncation, the baseline: no summary (every call fails) and no recall.
            env["CHAT_CONTEXT_RECALL"] = "false"
        if self.embeddings:
            env.update(
                LLM_EMBEDDING_MODEL="bench-embeddings", LLM_EMBEDDING_BASE_URL=self.embeddings
            )
        return env


# One server process, the bench URLconf (its background-idle route), no configuration file, no
# titles (a title is a summary-model call: the counts are of summarising calls only).
_APP = {"CADAU_URLCONF": "bench.urls", "CADAU_CONFIG": "", "CHAT_AUTO_TITLE": "off"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fidelity")
    group.add_argument(
        "--fidelity-data",
        "--data",
        dest="fidelity_data",
        type=Path,
        default=DEFAULT_DATA,
        help="folder of LoCoMo conversation files (default ../shared/data/locomo)",
    )
    group.add_argument(
        "--fidelity-conversations", default="", help="conversation ids, e.g. 26,30 (default all)"
    )
    group.add_argument("--fidelity-budgets", default="48000,16000")
    group.add_argument("--fidelity-modes", default=",".join(MODES))
    group.add_argument("--fidelity-summaries", default=",".join(SUMMARIES))
    group.add_argument(
        "--fidelity-embeddings",
        default="",
        metavar="URL",
        help="an OpenAI-compatible /v1 URL serving embeddings: Cadau's runs recall semantically",
    )
    group.add_argument(
        "--fidelity-merge",
        action="store_true",
        help="report these runs with the earlier ones kept in .bench/fidelity-results.json",
    )
    group.add_argument(
        "--fidelity-quick",
        action="store_true",
        help=f"the first {QUICK_TURNS} turns and {QUICK_QUESTIONS} questions of each",
    )


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def configs_plan(
    *, modes: list[str], summaries: list[str], budgets: list[int], embeddings: str = ""
) -> list[Config]:
    unknown = [m for m in modes if m not in MODES] + [s for s in summaries if s not in SUMMARIES]
    if unknown:
        raise ValueError(f"unknown mode or summary quality: {', '.join(unknown)}")
    plan: list[Config] = []
    for budget in budgets:
        for mode in modes:
            if mode == "truncation":
                plan.append(Config(mode=mode, summaries="fail", budget=budget))
            elif mode in ("seed", "cadau"):
                # Semantic recall is Cadau's: the seed's loop has no recall to add it to.
                semantic = embeddings if mode == "cadau" else ""
                plan += [
                    Config(mode=mode, summaries=s, budget=budget, embeddings=semantic)
                    for s in summaries
                ]
    if "whole" in modes:
        plan.append(Config(mode="whole", summaries=summaries[0], budget=WHOLE_BUDGET))
    return plan


def _template(folder: Path) -> Path:
    """A migrated database holding the bench user, copied for every run."""
    path = folder / "fidelity-template.sqlite3"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    env = app_env(f"sqlite:///{path}", keep_redis=False, **_APP)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    create = (
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.create_user({USERNAME!r}, password={PASSWORD!r})"
    )
    subprocess.run(
        [*manage, "shell", "-c", create],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return path


def _fresh_copy(template: Path, folder: Path) -> Path:
    path = folder / "fidelity-run.sqlite3"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
        if Path(f"{template}{suffix}").is_file():
            shutil.copyfile(f"{template}{suffix}", f"{path}{suffix}")
    return path


def _one(
    *, conv: Conversation, config: Config, fake: ServerProcess, template: Path, folder: Path
) -> dict[str, Any]:
    control = f"{fake.url}/_control"
    httpx.post(f"{control}/reset", timeout=10).raise_for_status()
    httpx.post(
        f"{control}/config", json={"summary_style": config.summaries}, timeout=10
    ).raise_for_status()
    db = _fresh_copy(template, folder)
    started = time.perf_counter()
    app = ServerProcess.app(
        env=config.env(db=db, fake_url=fake.url), log_path=folder / "fidelity-app.log"
    )
    try:
        app.wait_ready(timeout=120)
        up = time.perf_counter() - started
        outcome: Outcome = conversation_run(
            app_url=app.url, fake_url=fake.url, conv=conv, budget=config.budget
        )
    finally:
        app.stop()
    return {
        "conversation": conv.name,
        "config": asdict(config),
        "label": config.label,
        "seconds": time.perf_counter() - started,
        "start_seconds": up,
        **asdict(outcome),
    }


def measure(*, convs: list[Conversation], plan: list[Config], folder: Path) -> list[dict[str, Any]]:
    """Every conversation under every configuration; `folder` holds the databases and logs."""
    template = _template(folder)
    fake = ServerProcess.fake_llm(
        env=app_env(f"sqlite:///{template}"), log_path=folder / "fidelity-fakellm.log"
    )
    fake.wait_ready(path="/_control/health", timeout=60)
    results: list[dict[str, Any]] = []
    try:
        for conv in convs:
            for config in plan:
                result = _one(conv=conv, config=config, fake=fake, template=template, folder=folder)
                results.append(result)
                _progress(result, conv=conv)
                # A run stopped halfway keeps what it measured.
                (folder / "fidelity-partial.json").write_text(json.dumps(results, indent=1))
    finally:
        fake.stop()
    return results


def run(*, args: Any, command: str) -> str:
    started = time.perf_counter()
    folder = ROOT / ".bench"
    folder.mkdir(exist_ok=True)
    data_dir = Path(args.fidelity_data)
    paths = _find(data_dir, _split(args.fidelity_conversations))
    if not paths:
        raise SystemExit(f"fidelity: no conversation files in {data_dir}")
    plan = configs_plan(
        modes=_split(args.fidelity_modes),
        summaries=_split(args.fidelity_summaries),
        budgets=[int(b) for b in _split(args.fidelity_budgets)],
        embeddings=args.fidelity_embeddings,
    )
    convs = [conversation_load(p) for p in paths]
    if args.fidelity_quick:
        convs = [conversation_cut(c, turns=QUICK_TURNS, questions=QUICK_QUESTIONS) for c in convs]
    results = measure(convs=convs, plan=plan, folder=folder)
    for result in results:
        result["quick"] = bool(args.fidelity_quick)
    wall = time.perf_counter() - started
    starting = sum(r["start_seconds"] for r in results)
    store = folder / (
        "fidelity-results-quick.json" if args.fidelity_quick else "fidelity-results.json"
    )
    merged = 0
    if args.fidelity_merge and store.is_file():
        earlier = results_merge(earlier=json.loads(store.read_text()), new=results)
        merged = len(earlier) - len(results)
        results = earlier
    store.write_text(json.dumps(results, indent=1))
    names = list(dict.fromkeys(r["conversation"] for r in results))
    if names != [c.name for c in convs]:
        convs = [conversation_load(data_dir / f"{n}.json") for n in names]
        if args.fidelity_quick:
            convs = [
                conversation_cut(c, turns=QUICK_TURNS, questions=QUICK_QUESTIONS) for c in convs
            ]
    return render(
        results=results,
        convs=convs,
        command=command,
        wall_seconds=wall,
        quick=args.fidelity_quick,
        start_seconds=starting,
        merged=merged,
    )


def results_merge(
    *, earlier: list[dict[str, Any]], new: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`new` with the earlier runs of the same kind (quick or not) that it does not repeat (a
    conversation under a configuration), ordered by conversation as they first appeared."""
    quick = {r["quick"] for r in new}
    fresh = {(r["conversation"], json.dumps(r["config"], sort_keys=True)) for r in new}
    kept = [
        r
        for r in earlier
        if bool(r.get("quick")) in quick
        and (r["conversation"], json.dumps(r["config"], sort_keys=True)) not in fresh
    ]
    order = list(dict.fromkeys(r["conversation"] for r in [*kept, *new]))
    return sorted([*kept, *new], key=lambda r: order.index(r["conversation"]))


def _progress(result: dict[str, Any], *, conv: Conversation) -> None:
    scored = result["questions"]
    share = 100.0 * sum(1 for _c, ok, _r in scored if ok) / len(scored) if scored else 0.0
    budget = result["config"]["budget"]
    print(
        f"[fidelity] {conv.name} {result['label']} @ {budget}: {share:.0f}% of {len(scored)}, "
        f"max payload {result['max_payload_runes']}, over budget {result['over_budget']}, "
        f"summary calls {result['replay_summary_calls']}+{result['question_summary_calls']}, "
        f"failed sends {len(result['failed_sends'])}, {result['seconds']:.0f} s",
        flush=True,
    )
