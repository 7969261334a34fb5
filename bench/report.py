"""docs/benchmarks.md holds one marked section per benchmark, so re-running one benchmark
rewrites its own section and leaves the others (possibly measured on another day) alone."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

HEADER = """# Benchmarks

Produced by `make bench` (= `.venv/bin/python -m bench`); each section below is rewritten by its
own benchmark (`python -m bench NAME`), the others are left as they were. `python -m bench --help`
lists the benchmarks and options.
"""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def write_section(*, path: Path, name: str, body: str) -> None:
    begin, end = _markers(name)
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.is_file() else HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        # A function replacement: the body may contain backslashes that re.sub would interpret.
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def pct(values: list[float], q: int) -> float:
    """The q-th percentile of `values` (inclusive method); NaN for none."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
