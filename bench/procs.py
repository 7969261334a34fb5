"""Child processes that the benchmarks and the multi-process tests start: the app under Daphne
or uvicorn, the fake LLM server, and the flags for Debian's Chromium. One place, so every
caller starts, waits for and stops them the same way (and never leaves one running)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parent.parent
APP = "cadau.asgi:application"
# ServerProcess.app's Daphnes: the module each runs as.
_DAPHNE_MODULES = {
    "daphne": "cadau.serve",
    "daphne-asyncio": "daphne",
    "daphne-steps": "bench.ttft_steps",
}

CHROMIUM = os.environ.get("CADAU_CHROMIUM", "/usr/bin/chromium")
# Headless as root, and without the background traffic that this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def worker_run(module: str, *args: str, env: dict[str, str], stdin: str | None = None) -> Any:
    """Run a benchmark's worker module (`python -m module args...`) in the project's root with
    `env`, its stderr left on the terminal, and return the JSON on the last line it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        name = args[0] if args else ""
        raise RuntimeError(f"{module} {name} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# A benchmark (or a browser test) is one user driving load on purpose: the per-user limits a
# public instance sets would measure themselves (cadau/settings.py has their defaults).
NO_LIMITS = {
    "THROTTLE_API_READ": "off",
    "THROTTLE_API_WRITE": "off",
    "THROTTLE_CHAT_SEND": "off",
    "THROTTLE_SESSION_CREATE": "off",
    "THROTTLE_SESSION_UPDATE": "off",
    "THROTTLE_SESSION_COMPACT": "off",
    "THROTTLE_MEMORY_ENTRY_CREATE": "off",
    "THROTTLE_LOGIN_IP": "off",
    "THROTTLE_LOGIN_USERNAME": "off",
    "CHAT_MAX_CONCURRENT_REPLIES": "0",
    "CHAT_MAX_SOCKETS_PER_USER": "0",
    "WS_MAX_FRAMES_PER_MINUTE": "0",
}


def app_env(database_url: str, *, keep_redis: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's app or worker process: this one's, no per-user limits,
    production settings (DEBUG off, warnings only), `database_url`, then `extra`. Without
    `keep_redis` the in-memory channel layer (one process, as `make run`). A SECRET_KEY of its
    own when neither the environment nor .env.local has one."""
    env = dict(os.environ)
    env.update(NO_LIMITS)
    env.update(
        DATABASE_URL=database_url,
        DEBUG="false",
        ALLOWED_HOSTS="127.0.0.1,localhost,testserver",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    if not keep_redis:
        env.pop("REDIS_URL", None)
    if "SECRET_KEY" not in env and not (ROOT / ".env.local").is_file():
        env["SECRET_KEY"] = secrets.token_urlsafe(50)
    return env


def database_url(settings_dict: dict[str, Any]) -> str:
    """DATABASE_URL of a Django connection's settings, so a child process can open the same
    database (tests pass the test database pytest-django created)."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "")
    password = quote(settings_dict.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    return f"postgres://{auth}{host}:{settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening_sockets(count: int) -> list[socket.socket]:
    """`count` listening loopback sockets on one port, each to hand to one server process
    (`--fd`). SO_REUSEPORT: the kernel spreads new connections evenly over them; one socket
    shared by all would go mostly to whichever process happens to be awake (Twisted accepts
    up to 100 connections per wake-up)."""
    sockets: list[socket.socket] = []
    port = 0
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        port = int(sock.getsockname()[1])
        sockets.append(sock)
    return sockets


class ServerProcess:
    """A child serving HTTP on a loopback port, its output in `log_path`. Use as a context
    manager, or call `stop()`."""

    def __init__(
        self,
        *,
        argv: list[str],
        port: int,
        env: dict[str, str],
        log_path: Path,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
        )

    @classmethod
    def app(
        cls,
        *,
        env: dict[str, str],
        log_path: Path,
        server: Literal["daphne", "daphne-asyncio", "daphne-steps", "uvicorn"] = "daphne",
        port: int | None = None,
    ) -> ServerProcess:
        """The real ASGI app, as `make run` serves it (Daphne on uvloop, cadau/serve.py), as
        plain `python -m daphne` serves it (asyncio's own loop), as `make run` serves it with a
        timestamp at each step of a send (bench/ttft_steps.py), or under uvicorn."""
        port = port or free_port()
        if server in _DAPHNE_MODULES:
            module = _DAPHNE_MODULES[server]
            argv = [sys.executable, "-m", module, "-b", "127.0.0.1", "-p", str(port), APP]
        else:
            argv = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
        return cls(argv=argv, port=port, env=env, log_path=log_path)

    @classmethod
    def daphne_on_socket(
        cls, *, env: dict[str, str], log_path: Path, listener: socket.socket
    ) -> ServerProcess:
        """Daphne accepting on a socket its parent opened (`--fd`; README, "Running N
        processes")."""
        fd = listener.fileno()
        port = int(listener.getsockname()[1])
        argv = [sys.executable, "-m", "cadau.serve", "--fd", str(fd), APP]
        return cls(argv=argv, port=port, env=env, log_path=log_path, pass_fds=(fd,))

    @classmethod
    def fake_llm(
        cls,
        *,
        env: dict[str, str],
        log_path: Path,
        token_ms: float = 0.0,
        reply_words: int = 0,
        port: int | None = None,
    ) -> ServerProcess:
        port = port or free_port()
        argv = [sys.executable, "manage.py", "fakellm", "--port", str(port)]
        argv += ["--token-ms", f"{token_ms:g}", "--reply-words", str(reply_words)]
        return cls(argv=argv, port=port, env=env, log_path=log_path)

    def wait_ready(self, *, path: str = "/api/v1/auth/token", timeout: float = 60.0) -> None:
        """Until any HTTP answer comes from `path` (a 405 will do), or raise with the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                httpx.get(self.url + path, timeout=2.0)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.proc.args!r} did not come up:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
