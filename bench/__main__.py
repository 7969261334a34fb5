"""`python -m bench [NAME ...] [options]`: run the named benchmarks (default: all), print each
result and write it into its own section of docs/benchmarks.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bench import context as context_bench
from bench import faults as faults_bench
from bench import fidelity as fidelity_bench
from bench import history as history_bench
from bench import realmodel as realmodel_bench
from bench import realtime as realtime_bench
from bench import search as search_bench
from bench import ttft as ttft_bench
from bench import ui as ui_bench
from bench.report import write_section

ROOT = Path(__file__).resolve().parent.parent

# name -> (add its options, run it and return the markdown section)
BENCHMARKS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[..., str]]] = {
    "history": (history_bench.add_arguments, history_bench.run),
    "ui": (ui_bench.add_arguments, ui_bench.run),
    "realtime": (realtime_bench.add_arguments, realtime_bench.run),
    "context": (context_bench.add_arguments, context_bench.run),
    "ttft": (ttft_bench.add_arguments, ttft_bench.run),
    "search": (search_bench.add_arguments, search_bench.run),
    "faults": (faults_bench.add_arguments, faults_bench.run),
    "fidelity": (fidelity_bench.add_arguments, fidelity_bench.run),
    # Not in the default run: it needs the realllm extra and takes minutes.
    "realmodel": (realmodel_bench.add_arguments, realmodel_bench.run),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument(
        "--output", type=Path, default=ROOT / "docs" / "benchmarks.md", help="markdown file"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    for add_arguments, _run in BENCHMARKS.values():
        add_arguments(parser)
    args = parser.parse_args(argv)
    names = args.names or [name for name in BENCHMARKS if name != "realmodel"]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    for name in names:
        body = BENCHMARKS[name][1](args=args, command=command.strip())
        print(body, flush=True)
        if not args.no_write:
            write_section(path=args.output, name=name, body=body)
            print(f"\n(written to {args.output})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
