"""`python -m bench faults`: N server processes on a PostgreSQL cluster and a Redis server of the
benchmark's own (bench/faults_infra.py), a sender and a watcher (on another process) per
session (bench/faults_client.py), and one fault per scenario, injected a third into the run:

- `none`: no fault (what the layer loses by itself);
- `kill9`: kill -9 of the first server process;
- `redis`: Redis stopped for --faults-outage seconds, then started again (empty);
- `postgres`: PostgreSQL restarted (fast shutdown: every connection cut);
- `llm`: the fake model server killed mid-stream, started again after 3 s;
- `burst`: --faults-burst sockets opened at once.

Counted per scenario: sends attempted / acknowledged / stored / duplicated / lost; replies
complete / failed / stuck (still `streaming` once the run settled); sender streams that ended
with neither `done` nor `error`; watchers missing a reply's `done` or showing a text other than
the stored one; sockets refused; REST 500s (and 503s, the honest answer during an outage); and
for `kill9`, how long the killed process's sessions took to take a new send."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.faults_client import Counts, Load, Target
from bench.faults_infra import OwnPostgres, OwnRedis
from bench.procs import ServerProcess, free_port
from bench.realtime_client import log
from bench.realtime_servers import manage, server_env

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
SCENARIOS = ("none", "kill9", "redis", "postgres", "llm", "burst")

_SETUP = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token
from chat.models import ChatSession
users, per_user = int(sys.argv[1]), int(sys.argv[2])
out = []
for u in range(users):
    user, _ = get_user_model().objects.get_or_create(username=f"faults-{u}")
    client = Client()
    client.force_login(user)
    token, _ = Token.objects.get_or_create(user=user)
    for s in range(per_user):
        session = ChatSession.objects.create(owner=user, title=f"faults {u}.{s}")
        out.append([session.pk, client.cookies["sessionid"].value, token.key])
print(json.dumps(out))
"""

_FACTS = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
django.setup()
from chat.models import ChatMessage
ids = json.loads(sys.stdin.read())
rows = ChatMessage.objects.filter(session_id__in=ids).values_list(
    "id", "session_id", "role", "status", "content", "client_id", "metadata")
print(json.dumps([list(r) for r in rows]))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("faults")
    group.add_argument("--faults-processes", type=int, default=3)
    group.add_argument("--faults-users", type=int, default=10)
    group.add_argument("--faults-sessions", type=int, default=2, help="per user")
    group.add_argument("--faults-seconds", type=float, default=24.0, help="load per scenario")
    group.add_argument("--faults-outage", type=float, default=10.0, help="Redis down, seconds")
    group.add_argument("--faults-burst", type=int, default=200)
    group.add_argument(
        "--faults-scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated: " + ", ".join(SCENARIOS),
    )


class Bench:
    def __init__(self, *, args: argparse.Namespace, pg: OwnPostgres, redis: OwnRedis) -> None:
        self.args, self.pg, self.redis = args, pg, redis
        self.llm_port = free_port()
        self.llm: ServerProcess | None = None
        self.env = server_env(database_url=pg.url, llm_url=f"http://127.0.0.1:{self.llm_port}/v1")
        self.env.update(
            REDIS_URL=redis.url,
            REDIS_PREFIX="faults",
            # The caps a public server runs with: "users refused" must mean something.
            CHAT_MAX_SOCKETS_PER_USER="20",
            # Limits on, far above the load: every send goes through the counters (Redis), as
            # on a public server, where an outage answered every send 500.
            THROTTLE_CHAT_SEND="100000/min",
            LOG_LEVEL="WARNING",
        )

    def llm_start(self) -> None:
        self.llm = ServerProcess.fake_llm(
            env=self.env,
            log_path=CACHE / "faults-llm.log",
            token_ms=40,
            reply_words=60,
            port=self.llm_port,
        )
        self.llm.wait_ready(path="/v1/models")

    def servers_start(self, name: str) -> list[ServerProcess]:
        servers = [
            ServerProcess.app(env=self.env, log_path=CACHE / f"faults-{name}-app-{i}.log")
            for i in range(self.args.faults_processes)
        ]
        for server in servers:
            server.wait_ready(timeout=120)
        return servers

    def targets(self, ports: list[int]) -> list[Target]:
        rows = json.loads(
            manage(
                self.env,
                "-c",
                _SETUP,
                str(self.args.faults_users),
                str(self.args.faults_sessions),
            )
            .strip()
            .splitlines()[-1]
        )
        n = len(ports)
        return [
            Target(
                session_id=session_id,
                cookie=cookie,
                token=token,
                sender_port=ports[i % n],
                watcher_port=ports[(i + 1) % n],
                transport="ws" if i % 2 == 0 else "sse",
            )
            for i, (session_id, cookie, token) in enumerate(rows)
        ]

    def facts(self, session_ids: list[int]) -> list[list[Any]]:
        out = manage(self.env, "-c", _FACTS, stdin=json.dumps(session_ids))
        rows: list[list[Any]] = json.loads(out.strip().splitlines()[-1])
        return rows

    async def fault(self, name: str, servers: list[ServerProcess], load: Load) -> dict[str, Any]:
        """Inject the scenario's fault; what it did and when."""
        info: dict[str, Any] = {"at": time.monotonic()}
        load.fault_at = info["at"]
        if name == "kill9":
            victim = servers[0]
            os.kill(victim.proc.pid, signal.SIGKILL)
            load.alive.discard(victim.port)
            info["port"] = victim.port
        elif name == "redis":
            self.redis.stop()
            await asyncio.sleep(self.args.faults_outage)
            self.redis.start()
        elif name == "postgres":
            await asyncio.to_thread(self.pg.restart)
        elif name == "llm":
            assert self.llm is not None
            os.kill(self.llm.proc.pid, signal.SIGKILL)
            self.llm.proc.wait()
            await asyncio.sleep(3)
            await asyncio.to_thread(self.llm_start)
        elif name == "burst":
            info["burst_failed"] = await _burst(load, servers, self.args.faults_burst)
        load.faults_over.set()
        return info

    async def scenario(self, name: str) -> dict[str, Any]:
        servers = self.servers_start(name)
        ports = [s.port for s in servers]
        try:
            targets = self.targets(ports)
            counts = Counts()
            load = Load(ports=ports, alive=set(ports), counts=counts)
            load.burst_targets = targets  # type: ignore[attr-defined]
            seconds = self.args.faults_seconds
            load.stop_at = time.monotonic() + seconds
            if name == "none":
                load.faults_over.set()
            tasks = [asyncio.ensure_future(load.watcher(t)) for t in targets]
            await asyncio.sleep(1.0)  # the watchers are on before the first send
            tasks += [asyncio.ensure_future(load.sender(t)) for t in targets]
            info: dict[str, Any] = {}
            if name != "none":
                await asyncio.sleep(seconds / 3)
                info = await self.fault(name, servers, load)
            # Senders finish their turn; watchers stay 20 s more (the lease, the catch-up).
            await asyncio.gather(*tasks, return_exceptions=True)
            rows = await asyncio.to_thread(self.facts, [t.session_id for t in targets])
            return _tally(name=name, counts=counts, rows=rows, targets=targets, info=info)
        finally:
            for server in servers:
                server.stop()


async def _burst(load: Load, servers: list[ServerProcess], count: int) -> int:
    """Open `count` sockets at once over the users' sessions and processes, hold them a few
    seconds: how many failed."""
    import websockets

    targets: list[Target] = load.burst_targets  # type: ignore[attr-defined]
    ports = [s.port for s in servers]

    async def one(i: int) -> bool:
        target, port = targets[i % len(targets)], ports[i % len(ports)]
        url = f"ws://127.0.0.1:{port}/ws/chat/{target.session_id}/"
        headers = {"Cookie": f"sessionid={target.cookie}", "Origin": f"http://127.0.0.1:{port}"}
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=60) as ws:
                await asyncio.sleep(3)
                return ws.close_code is None
        except Exception:
            return False

    results = await asyncio.gather(*(one(i) for i in range(count)))
    return sum(1 for ok in results if not ok)


def _tally(
    *, name: str, counts: Counts, rows: list[list[Any]], targets: list[Target], info: dict[str, Any]
) -> dict[str, Any]:
    users = [r for r in rows if r[2] == "user"]
    replies = [r for r in rows if r[2] == "assistant"]
    stored_ids = [r[5] for r in users if r[5] in counts.attempted]
    per_user_message: dict[int, int] = {}
    for r in replies:
        to = (r[6] or {}).get("reply_to")
        if to is not None:
            per_user_message[to] = per_user_message.get(to, 0) + 1
    final = [r for r in replies if r[3] in ("complete", "failed", "cancelled")]
    missing = [r for r in final if not counts.watched.get(r[0], {}).get("done")]
    missing_done = len(missing)
    for r in missing:
        seen = counts.watched.get(r[0])
        log(
            f"faults: {name}: watcher of session {r[1]} never saw the end of reply {r[0]} "
            f"({r[3]}, {len(r[4])} chars); it saw {len(seen['text']) if seen else 'nothing'}"
        )
    mismatched = sum(1 for r in final if counts.watched.get(r[0], {}).get("mismatch"))
    result: dict[str, Any] = {
        "scenario": name,
        "attempted": len(counts.attempted),
        "acknowledged": len(counts.acknowledged),
        "stored": len(set(stored_ids)),
        "duplicated": (len(stored_ids) - len(set(stored_ids)))
        + sum(n - 1 for n in per_user_message.values() if n > 1),
        "lost": len(counts.acknowledged - set(stored_ids)),
        "complete": sum(1 for r in replies if r[3] == "complete"),
        "failed": sum(1 for r in replies if r[3] in ("failed", "cancelled")),
        "stuck": sum(1 for r in replies if r[3] == "streaming"),
        "streams_silent": counts.streams_silent,
        "streams_cut": counts.streams_cut,
        "watch_missing_done": missing_done,
        "watch_wrong_text": mismatched,
        "refused": counts.refused + info.get("burst_failed", 0),
        "rest_500": counts.rest_500,
        "rest_503": counts.rest_503,
    }
    if name == "kill9":
        at, port = info["at"], info["port"]
        waits = []
        for t in targets:
            if t.sender_port == port:
                later = [a for a in counts.acks.get(t.session_id, []) if a > at]
                waits.append(min(later) - at if later else float("inf"))
        result["kill9_new_send_s"] = round(max(waits), 1) if waits else None
    return result


METHOD = """How it counts. *sends*: distinct `client_id`s a sender tried (a send that got no
answer is retried with the same `client_id`, on another process when its own is gone: the
retries are not new sends); *acked*: those whose stored user message came back to the sender;
*stored*/*dup*/*lost*: read from the database after the run (a duplicate is a `client_id`
stored twice or a user message with two replies; lost: acknowledged, not stored). *replies*:
the sessions' assistant rows after the run settled (*stuck*: still `streaming`). *failed*: replies
stored `failed` (a killed process's, `interrupted`; in `llm`, every send while the model
server was down fails at once with `llm_error`, and its sender sends the next one). *no
done/error*: sender streams that ended cleanly with neither (a connection cut by a killed
process is not one: it is retried). *watcher no done*: replies final in the database of which
the session's watcher (a socket on another process, reconnecting and catching up through the
history API as the page does) never learned the end; *watcher wrong text*: a complete reply
whose text, as the watcher's deltas built it, differs from the stored one. *refused*: a watcher
refused by a live process after the fault (4429 or a failed handshake), or a burst socket that
failed. *REST 503*: the honest answer while a dependency is down (`Retry-After`); a 500 is a
bug. The PostgreSQL cluster (`initdb`) and the Redis server are the benchmark's own, on free
ports, thrown away after; the shared 5432 / 6379 are never touched."""


COLUMNS = (
    ("scenario", "scenario"),
    ("attempted", "sends"),
    ("acknowledged", "acked"),
    ("stored", "stored"),
    ("duplicated", "dup"),
    ("lost", "lost"),
    ("complete", "replies ok"),
    ("failed", "failed"),
    ("stuck", "stuck"),
    ("streams_silent", "no done/error"),
    ("watch_missing_done", "watcher no done"),
    ("watch_wrong_text", "watcher wrong text"),
    ("refused", "refused"),
    ("rest_500", "REST 500"),
    ("rest_503", "REST 503"),
)


def report(results: list[dict[str, Any]], *, args: argparse.Namespace, command: str) -> str:
    head = "| " + " | ".join(label for _k, label in COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    lines = [head, rule]
    for r in results:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k, _l in COLUMNS) + " |")
    kill = [r.get("kill9_new_send_s") for r in results if r["scenario"] == "kill9"]
    return "\n".join(
        [
            "## Faults: processes killed, Redis and PostgreSQL restarted, under load",
            "",
            f"`{command}`: {args.faults_processes} server processes (Daphne on uvloop) on a "
            "PostgreSQL cluster and a Redis server of the benchmark's own, "
            f"{args.faults_users} users x {args.faults_sessions} sessions, per session a sender "
            "(WebSocket or REST server-sent events, alternately) and a watcher socket on another "
            f"process; {args.faults_seconds:g} s of sends per scenario, the fault a third in. "
            "Method: bench/faults.py.",
            "",
            *lines,
            "",
            f"After kill -9, the killed process's sessions took a new send within: "
            f"{kill[0] if kill else 'n/a'} s.",
            "",
            METHOD,
        ]
    )


def run(*, args: argparse.Namespace, command: str) -> str:
    names = [n for n in args.faults_scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown fault scenario(s): {unknown}")
    CACHE.mkdir(exist_ok=True)
    # A SIGTERM unwinds like Ctrl-C: the clusters and servers of the run are stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    results = []
    with OwnPostgres() as pg, OwnRedis() as redis:
        bench = Bench(args=args, pg=pg, redis=redis)
        log(f"faults: PostgreSQL {pg.url}, Redis {redis.url}")
        manage(bench.env, "manage.py", "migrate", "--noinput", "-v", "0")
        bench.llm_start()
        try:
            for name in names:
                log(f"faults: scenario {name}")
                results.append(asyncio.run(bench.scenario(name)))
                log(f"faults: {results[-1]}")
        finally:
            if bench.llm is not None:
                bench.llm.stop()
    args.faults_results = results
    return report(results, args=args, command=command)
