"""Concurrent writers: appends never interleave or get lost; one fact never becomes two files.

Blocks are made larger than PIPE_BUF (4 KiB) on purpose: below that, O_APPEND writes are often
atomic by luck, which would let a missing lock go unnoticed."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import pytest

from agentmemory import store
from tests.agentmemory.conftest import fake_row

pytestmark = pytest.mark.usefixtures("fake_agents")

AGENT = 5
DAY = date(2025, 6, 1)
PADDING_LINES = 60  # ~5 KB per block


def _body(writer: str, index: int) -> str:
    tag = f"{writer}-{index}"
    lines = [f"BEGIN {tag}"] + [f"{tag} line {n:03d} " + "x" * 70 for n in range(PADDING_LINES)]
    return "\n".join([*lines, f"END {tag}"])


def _append(writer: str, index: int) -> None:
    store.daily_note_append(
        agent_id=AGENT, day=DAY, heading=f"block {writer}-{index}", body=_body(writer, index)
    )


def _assert_all_blocks_intact(text: str, expected: set[str]) -> None:
    assert text.startswith(f"# {DAY.isoformat()}\n")
    assert text.count(f"# {DAY.isoformat()}\n") == 1
    seen = []
    for block in re.split(r"\n## block ", text)[1:]:
        header, _, body = block.partition("\n\n")
        writer, index = header.rsplit("-", 1)
        assert body.rstrip("\n") == _body(writer, int(index)), f"block {header} is torn"
        seen.append(header)
    assert len(seen) == len(set(seen)), "a block was written twice"
    assert set(seen) == expected, "a block is missing"


def test_threads_appending_concurrently(runtime: Path):
    writers, per_writer = 16, 15
    barrier = threading.Barrier(writers)

    def work(w: int) -> None:
        barrier.wait()  # maximise overlap
        for i in range(per_writer):
            _append(f"t{w}", i)

    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(work, range(writers)))
    text = store.daily_note_read(agent_id=AGENT, day=DAY)
    _assert_all_blocks_intact(
        text, {f"t{w}-{i}" for w in range(writers) for i in range(per_writer)}
    )


def _process_worker(runtime: str, writer: int, per_writer: int, threads: int, start) -> None:
    # Runs in a freshly spawned interpreter: nothing is inherited but the environment.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup()
    from django.test.utils import override_settings

    from agentmemory import folders

    folders.agent_lookup = fake_row  # no agents in a database here

    with override_settings(RUNTIME_DIR=Path(runtime), AGENT_MEMORY_STORAGE=""):
        start.wait()

        def work(t: int) -> None:
            for i in range(per_writer):
                _append(f"p{writer}t{t}", i)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(work, range(threads)))


def test_processes_and_threads_appending_concurrently(runtime: Path):
    processes, threads, per_writer = 4, 4, 10
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    workers = [
        ctx.Process(target=_process_worker, args=(str(runtime), p, per_writer, threads, start))
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    start.set()
    # The parent writes too, so in-process threads and other processes contend together.
    for i in range(per_writer):
        _append("parent", i)
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    text = store.daily_note_read(agent_id=AGENT, day=DAY)
    expected = {
        f"p{p}t{t}-{i}" for p in range(processes) for t in range(threads) for i in range(per_writer)
    } | {f"parent-{i}" for i in range(per_writer)}
    _assert_all_blocks_intact(text, expected)


def test_concurrent_writes_of_one_fact_make_one_entry(runtime: Path):
    barrier = threading.Barrier(12)

    def work(n: int):
        barrier.wait()
        return store.entry_write(
            agent_id=AGENT, name=None, content=f"The office wifi password is on the fridge{'!' * n}"
        )

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(work, range(12)))
    assert sum(r.created for r in results) == 1
    assert len(store.entry_list(agent_id=AGENT)) == 1


def test_readers_never_see_a_torn_workspace_file(runtime: Path):
    versions = [chr(ord("a") + n) * 200_000 for n in range(6)]
    store.workspace_write(agent_id=AGENT, path="doc.txt", content=versions[0])
    stop = threading.Event()
    torn: list[int] = []

    def read_loop() -> None:
        while not stop.is_set():
            text = store.workspace_read(agent_id=AGENT, path="doc.txt")
            if text not in versions:
                torn.append(len(text))

    readers = [threading.Thread(target=read_loop) for _ in range(3)]
    for reader in readers:
        reader.start()
    for _round in range(5):
        for version in versions:
            store.workspace_write(agent_id=AGENT, path="doc.txt", content=version)
    stop.set()
    for reader in readers:
        reader.join()
    assert torn == []
