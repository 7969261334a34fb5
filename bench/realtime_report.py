"""The markdown section of `python -m bench realtime`: the table of every run, the targets and
the analysis of the figures."""

from __future__ import annotations

import argparse
import os
import platform
import time

from bench.realtime_client import RunResult

TARGET_P99_1_MS = 5.0
# What the figures mean and what was done about them; kept with the code that measures them.
ANALYSIS: list[str] = [
    "Where the time goes: 200 replies at one token per 20 ms are 10,000 upstream SSE chunks "
    "and up to 10,000 WebSocket frames a second, plus 200 sends' database work arriving at "
    "once and 200 final writes a few seconds later. All of it is Python, on one event loop "
    "per server process, on 2 cores that also run the client, the fake model, PostgreSQL and "
    "Redis. The 1-client rows show the cost of a token itself is well under a millisecond; "
    "under load the latency is queueing. The ramp-up and ramp-down columns show where: while "
    "all 200 stream and no database work is in flight, the p95 stays at a few milliseconds; "
    "the slow tokens sit in the ramp-up (200 sends' ORM work) and the ramp-down (200 final "
    "writes), where worker threads running ORM code hold the GIL the event loop needs for "
    "every token. A thread that gives the GIL up for a system call waits up to the 5 ms "
    "switch interval to get it back while another thread computes, and the loop makes many "
    "such calls per iteration.",
    "",
    "The figures depend on the machine more than on anything else. The same code (e9357b6) "
    "measured a whole-run p95 of 68.5 ms (median of five runs, 55.0-83.5) on the machine of "
    "2026-12-02, whose speed moved by up to 50% from one minute to the next (CPU shared with "
    "other tenants), and 4.5 ms (2.8-23.3) on the steadier machine of 2026-12-03; the "
    "all-streaming window went from 30.5 to 0.9 ms. Hence several runs per server, taken in "
    "turns, and the median; and hence the work on the ramps below, which is what a slower or "
    "busier machine sees first.",
    "",
    "Fixes found with this benchmark and py-spy, in order (p95, 200 sockets, one process "
    "unless said): forwarded events skip Channels' per-message `close_old_connections` hop "
    "and the in-memory layer sweeps expiry once a second (28.6 s -> ~12 s); deltas coalesce "
    "when the loop falls behind (-> ~1.0 s); progress saves of all live replies are one "
    "transaction every 0.5 s (-> ~0.4 s). Then: the upstream stream is read by aiohttp under "
    "httpx's API (~140 -> ~70 us of CPU per chunk; chat/llm/transport.py); events reach this "
    "process's sockets straight into their outbox instead of through the channel layer, and "
    "deltas cross Redis only while another process watches the session "
    "(chat/events.py); a send's database work takes 4 trips instead of 10, on "
    "persistent connections, in the thread pool rather than queued behind one thread; frames "
    "are encoded with orjson; the fake model writes all streams from one pacer thread "
    "instead of 200 sleeping ones (~45% of a core before). Next: a send reuses the rows it "
    "stored and a finish writes the held row once (21 -> 14 queries per reply, ~9.6 -> ~6 ms "
    "of ORM CPU on SQLite); tokens go from the stream reader straight into the sockets' "
    "outboxes and a socket sends its whole backlog as one merged delta; SSE lines are split "
    "from the raw bytes and parsed with orjson; frames go to the server's own ASGI send; and "
    "Daphne's reactor runs on uvloop (`python -m cadau.serve`): with all 200 streaming, "
    "half-second buckets stayed at a p95 of 5-40 ms where asyncio's loop saturated at 60-130 "
    "ms (2026-12-02 machine). Last: a completed reply's `done` budget is worked out from the "
    "context its payload was built from, when the final write's guard shows that nothing "
    "moved it (no read-back: 14 -> 12 queries per reply, ~1.3 -> ~0.4 ms of CPU per "
    "finish); in alternated runs, eight each, the ramp-down p95 went from a median of ~130 "
    "ms (35-182) to ~52 ms (31-71), and the whole-run p95 from 6.7 to 2.6 ms.",
    "",
    "Tried and measured, not adopted: a 0.5-1 ms switch interval; one worker thread for all "
    "of a turn's database work; and at most one (or two) sends' database work at a time "
    "(a semaphore, eight and six alternated runs): the loop then contends with one thread "
    "instead of six, so p99 fell from ~35 to ~10 ms (two: ~17 ms), but the burst's last "
    "reply started 1.7 s after its send instead of 1.0 s and the whole-run p95 rose from "
    "3.4 to 7.6 ms (two: 12.1 ms).",
]
TARGET_P95_N_MS = 50.0


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def phases(result: RunResult) -> tuple[list[float], list[float], list[float]]:
    """Latencies of the deltas received before every reply had started (ramp-up: the sends'
    database work still running), while every socket was streaming (after the last reply
    started and before the first one ended, so no send, no final write is in the way), and
    after the first one ended (ramp-down: the final writes running)."""
    if not result.streams or len(result.streams) < result.clients:
        return [], [], []
    start = max(first for first, _ in result.streams)
    end = min(done for _, done in result.streams)
    split: tuple[list[float], list[float], list[float]] = ([], [], [])
    for at, lat in zip(result.received_at, result.latencies_ms, strict=True):
        split[0 if at < start else 2 if at > end else 1].append(lat)
    return split


def all_streaming(result: RunResult) -> list[float]:
    return phases(result)[1]


def peak_streams(streams: list[tuple[float, float]]) -> tuple[int, float]:
    """Most replies streaming at the same moment, and for how long (s) that many did."""
    edges = sorted([(a, 1) for a, _ in streams] + [(b, -1) for _, b in streams])
    peak, held, now, since = 0, 0.0, 0, 0.0
    for at, step in edges:
        if now == peak and now:
            held += at - since
        now += step
        if now > peak:
            peak, held = now, 0.0
        since = at
    return peak, held


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


def _verdict(values: list[float]) -> str:
    """Median of the runs' p95 (range), and whether the median meets the target."""
    median = percentile(values, 50)
    spread = f"{_ms(min(values))}-{_ms(max(values))}" if len(values) > 1 else ""
    verdict = "met" if median <= TARGET_P95_N_MS else "missed"
    return f"**{_ms(median)} ms**" + (f" ({spread})" if spread else "") + f", {verdict}"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value == value else "n/a"


def report(
    *,
    args: argparse.Namespace,
    command: str,
    rows: dict[str, tuple[RunResult, list[RunResult]]],
    db_label: str,
    load: tuple[float, float],
    notes: list[str],
) -> str:
    lines = [
        *_setup_lines(command=command, db_label=db_label),
        *_method_lines(args=args, load=load),
        *_table_lines(rows=rows),
        *[f"- {note}" for note in notes],
        *_target_lines(clients=args.rt_clients, rows=rows),
        "",
        *ANALYSIS,
    ]
    return "\n".join(lines)


def _setup_lines(*, command: str, db_label: str) -> list[str]:
    """The heading, what was measured on (versions, servers, database) and how to rerun it."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [
        "## Realtime: added latency per streamed token (WebSocket)",
        "",
        f"Measured {when} on {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        f"Daphne {_version('daphne')}, uvicorn {_version('uvicorn')}, Channels "
        f"{_version('channels')}, uvloop {_version('uvloop')}. *daphne*: `python -m "
        "cadau.serve`, as `make run` serves (Daphne, its Twisted reactor on a uvloop event "
        "loop); *daphne-asyncio*: plain `python -m daphne` (asyncio's own loop); *uvicorn*: "
        "`uvicorn` with uvloop and websockets, for comparison. One process: in-memory channel "
        f"layer, database {db_label}. N processes (`x N`): N Daphne processes on one port, each "
        "on its own SO_REUSEPORT socket (`--fd`), PostgreSQL and Redis (channels-redis "
        f"{_version('channels-redis')}).",
        "",
        "```sh",
        *([command] if command.strip() != "python -m bench realtime" else []),
        "python -m bench realtime   # this section (`make bench BENCH_ARGS=realtime`)",
        "python -m bench realtime --rt-clients 50 --rt-servers daphne   # quicker",
        "```",
        "",
    ]


def _method_lines(*, args: argparse.Namespace, load: tuple[float, float]) -> list[str]:
    """How the figures are taken and what each column counts."""
    n = args.rt_clients
    return [
        f"How: the fake LLM server runs as its own process and streams one token every "
        f"{args.rt_token_ms:g} ms ({args.rt_words} tokens per reply), stamping each chunk with "
        "its emit time (`x_emit_ts`, passed on by the app as `emitted_at` in `delta` events). "
        "The client (asyncio on uvloop + `websockets`, one process) notes `time.time()` when a "
        "frame arrives, before parsing it; **added latency = receive time - emit time** (same "
        "clock). It covers the app reading the upstream stream, the fan-out, the consumer and "
        "the WebSocket write. 1 client: "
        f"{args.rt_turns} turns back to back on one socket. {n} clients: {n} sockets, each on "
        "its own session, all connected first, then all send at once (one turn each); every "
        "delta of every reply counts, the burst of sends and final writes included; "
        f"{args.rt_repeats} such runs per server, the servers taking turns (all run side by "
        "side, idle but for the one under load), because the machine's speed drifts from "
        "minute to minute and one run is not a figure. "
        "*All streaming*: only the deltas received while every socket was streaming (after the "
        "last reply started, before the first ended); *ramp-up* and *ramp-down*: the deltas "
        "before and after that window, while the sends' and the final writes' database work "
        "runs. *First delta*: send to first delta, as "
        "the client sees it. RSS: the server processes summed, idle with all sockets open and "
        "peak while streaming (sampled every 100 ms). The client, the fake server, PostgreSQL "
        "and Redis run on the same 2 cores as the server, so their CPU is part of the figures. "
        f"1-minute load average before / after the run: {load[0]:.2f} / {load[1]:.2f} (other "
        "work on the machine shows here).",
        "",
    ]


def _table_lines(*, rows: dict[str, tuple[RunResult, list[RunResult]]]) -> list[str]:
    """One row per run: each server's 1-client run, then its N-client runs."""
    lines = [
        "| server | clients | run | tokens | p50 ms | p95 ms | p99 ms | max ms | all "
        "streaming: tokens, p95 ms | ramp-up, ramp-down: tokens, p95 ms | replies ok | "
        "streaming at once (for s) | first delta p95 ms | wall s | RSS idle MB | RSS peak MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: | ---: | ---: |",
    ]
    for label, (one, many) in rows.items():
        runs = [(one, "-")] + [(r, f"{i + 1}/{len(many)}") for i, r in enumerate(many)]
        lines += [_table_row(label=label, result=result, run=run) for result, run in runs]
    return lines


def _table_row(*, label: str, result: RunResult, run: str) -> str:
    lat = result.latencies_ms
    peak, held = peak_streams(result.streams)
    steady = all_streaming(result) if result.clients > 1 else []
    steady_cell = f"{len(steady):,}, {_ms(percentile(steady, 95))}" if steady else "-"
    up, _, down = phases(result) if result.clients > 1 else ([], [], [])
    ends_cell = (
        f"{len(up):,}, {_ms(percentile(up, 95))}; {len(down):,}, {_ms(percentile(down, 95))}"
        if up or down
        else "-"
    )
    return (
        f"| {label} | {result.clients} | {run} | {len(lat):,} | {_ms(percentile(lat, 50))} | "
        f"{_ms(percentile(lat, 95))} | {_ms(percentile(lat, 99))} | "
        f"{_ms(max(lat) if lat else float('nan'))} | {steady_cell} | {ends_cell} | "
        f"{result.replies - result.failed}/{result.expected} | "
        f"{peak} ({held:.1f}) | {_ms(percentile(result.first_delta_ms, 95))} | "
        f"{result.wall_s:.1f} | {result.rss_idle_mb:.0f} | {result.rss_peak_mb:.0f} |"
    )


def _target_lines(*, clients: int, rows: dict[str, tuple[RunResult, list[RunResult]]]) -> list[str]:
    """Each Daphne setup against the targets: 1-client p99, N-client p95 (median of runs)."""
    n = clients
    lines = [
        "",
        f"Targets (Daphne; for {n} clients the median of the runs, their range in brackets):",
    ]
    for label, (one, many) in rows.items():
        if not label.startswith("daphne"):
            continue
        p99 = percentile(one.latencies_ms, 99)
        whole = [percentile(r.latencies_ms, 95) for r in many]
        steady = [percentile(all_streaming(r), 95) for r in many]
        lines.append(
            f"- {label}: 1 client p99 <= {TARGET_P99_1_MS:g} ms: **{_ms(p99)} ms**, "
            f"{'met' if p99 <= TARGET_P99_1_MS else 'missed'}; {n} clients p95 <= "
            f"{TARGET_P95_N_MS:g} ms: {_verdict(whole)} over the whole run; "
            f"{_verdict(steady)} while all {n} were streaming."
        )
    return lines
