"""The servers of `python -m bench realtime`: which setups to serve the app with (Daphne,
Daphne on asyncio, uvicorn; one process or N behind one port), their environment, database
and sessions, and starting and stopping them."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from bench.procs import ServerProcess, app_env, listening_sockets
from bench.realtime_client import log

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"

Kind = Literal["daphne", "daphne-asyncio", "uvicorn"]
# The --rt-servers names: how each is started is in bench/procs.py, ServerProcess.app.
KINDS: tuple[Kind, ...] = get_args(Kind)

_SETUP = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from chat.models import ChatSession
n = int(sys.argv[1])
user, _ = get_user_model().objects.get_or_create(username="bench-rt")
client = Client()
client.force_login(user)
ids = [ChatSession.objects.create(owner=user, title=f"rt {i}").pk for i in range(n)]
print(json.dumps({"cookie": client.cookies["sessionid"].value, "sessions": ids}))
"""


def server_env(*, database_url: str, llm_url: str) -> dict[str, str]:
    return app_env(
        database_url,
        LLM_BASE_URL=llm_url,
        LLM_API_KEY="bench",
        LLM_MODEL="fake-chat",
        # Measure streaming, not summarising: the bench sessions stay far below any threshold.
        CHAT_BACKGROUND_COMPACTION="false",
    )


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, input=stdin, text=True, capture_output=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:1]!r}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc.stdout


@dataclass(kw_only=True)
class Setup:
    """One way of serving the app: a row group of the table."""

    label: str
    kind: Kind
    processes: int
    env: dict[str, str]


def _multi_env(*, args: argparse.Namespace, llm_url: str) -> tuple[dict[str, str] | None, str]:
    """Environment for N processes (PostgreSQL + Redis, as README "Running N processes"), or
    None and why not."""
    import redis

    from bench.history import _ensure_pg_database

    note = _ensure_pg_database(args.rt_pg_url)
    if note:
        return None, note
    try:
        redis.Redis.from_url(args.rt_redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        return None, f"skipped: Redis unreachable ({exc})"
    env = server_env(database_url=args.rt_pg_url, llm_url=llm_url)
    env["REDIS_URL"] = args.rt_redis_url
    return env, ""


def setups_plan(
    *,
    args: argparse.Namespace,
    servers: list[str],
    counts: list[int],
    env: dict[str, str],
    llm_url: str,
) -> tuple[list[Setup], list[str]]:
    """The setups to measure, in --rt-servers order (Daphne once per --rt-processes count), and
    a note for each multi-process one that cannot run here."""
    setups: list[Setup] = []
    notes: list[str] = []
    for name in servers:
        kind = cast(Kind, name)  # checked against KINDS by the caller
        for n in counts if kind == "daphne" else [1]:
            if n == 1:
                setups.append(Setup(label=kind, kind=kind, processes=1, env=env))
                continue
            multi, why = _multi_env(args=args, llm_url=llm_url)
            if multi is None:
                notes.append(f"{kind} x {n}: {why}")
                continue
            setups.append(Setup(label=f"{kind} x {n} (Redis)", kind=kind, processes=n, env=multi))
    return setups, notes


def setups_migrate(setups: list[Setup]) -> None:
    """Migrate each database the setups use, once (the multi-process ones share PostgreSQL)."""
    migrated: set[str] = set()
    for setup in setups:
        if setup.env["DATABASE_URL"] not in migrated:
            log(f"realtime: migrate {setup.env['DATABASE_URL']}")
            manage(setup.env, "manage.py", "migrate", "--noinput", "-v", "0")
            migrated.add(setup.env["DATABASE_URL"])


@dataclass(kw_only=True)
class Started:
    """One setup's servers, running, and the sessions its clients use."""

    setup: Setup
    servers: list[ServerProcess]
    listeners: list[socket.socket]
    sessions: list[int]
    cookie: str

    @property
    def port(self) -> int:
        return self.servers[0].port

    @property
    def pids(self) -> list[int]:
        return [server.proc.pid for server in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for listener in self.listeners:
            listener.close()


def setup_start(*, args: argparse.Namespace, setup: Setup) -> Started:
    ids = json.loads(
        manage(setup.env, "-c", _SETUP, str(args.rt_clients + 1)).strip().splitlines()[-1]
    )
    slug = setup.kind if setup.processes == 1 else f"{setup.kind}-x{setup.processes}"
    started = Started(
        setup=setup, servers=[], listeners=[], sessions=ids["sessions"], cookie=ids["cookie"]
    )
    try:
        if setup.processes == 1:
            started.servers.append(
                ServerProcess.app(
                    env=setup.env, log_path=CACHE / f"realtime-{slug}.log", server=setup.kind
                )
            )
        else:
            # One port, a socket per process (SO_REUSEPORT: the kernel spreads the clients).
            started.listeners = listening_sockets(setup.processes)
            for i, listener in enumerate(started.listeners):
                started.servers.append(
                    ServerProcess.daphne_on_socket(
                        env=setup.env,
                        log_path=CACHE / f"realtime-{slug}-{i}.log",
                        listener=listener,
                    )
                )
        for server in started.servers:
            server.wait_ready()
    except BaseException:
        started.stop()
        raise
    return started
