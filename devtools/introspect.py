"""Looks into a running Cadau process's in-memory state from tests and benchmarks (bench/):
what the product keeps to itself because nothing in it needs to ask. Reading the product's
private module state from here is deliberate; the product never imports this (pyproject's
import-linter contract)."""

from __future__ import annotations

from concurrent.futures import wait

from chat import workers
from chat.llm import window


def background_wait(timeout: float = 30.0) -> None:
    """Wait for the background jobs submitted so far (compactions and titles after replies):
    a test or benchmark reads their results, or stops, only once they are done."""
    wait(list(workers._pending), timeout=timeout)


def background_pending() -> int:
    """How many background jobs are submitted and not done yet."""
    return len(workers._pending)


def tokens_factors(*, model: str) -> dict[str, float]:
    """What usage has taught about `model`'s tokenizer, by script ("cjk", "other")."""
    return {script: f for (m, script), f in window._factor.items() if m == model}
