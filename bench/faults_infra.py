"""The dependencies `python -m bench faults` breaks on purpose: a PostgreSQL cluster and a Redis
server of its own, on free ports, in a temporary directory, never the shared 5432 / 6379. Each
can be stopped, started and restarted while the app's processes run on it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from bench.procs import free_port


def _as_postgres(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: as the `postgres` user when we are root.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


class OwnPostgres:
    """`initdb` into a temporary directory, served on a free loopback port (trust auth, no
    fsync: a benchmark's database, thrown away after)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="cadau-faults-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, user="postgres", group="postgres")
        self.data = self.dir / "data"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/cadau_faults"
        subprocess.run(
            _as_postgres(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust"]),
            check=True,
            capture_output=True,
        )
        self.start()
        subprocess.run(
            _as_postgres(
                [
                    "createdb",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    "cadau_faults",
                ]
            ),
            check=True,
            capture_output=True,
        )

    def _ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=300"
        )
        subprocess.run(
            _as_postgres(
                [
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-o",
                    options,
                    "-l",
                    str(self.dir / "log"),
                    "-w",
                    *args,
                ]
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        self._ctl("start")

    def stop(self) -> None:
        self._ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> OwnPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class OwnRedis:
    """redis-server on a free loopback port, nothing saved to disk: a restart loses every key
    (the channel layer's groups included), as a Redis without persistence does."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="cadau-faults-redis-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        log = (self.dir / "log").open("a")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> OwnRedis:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
