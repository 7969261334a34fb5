"""What Cadau knows about a model's context window in tokens, and how many tokens a text takes.

A window is configured (LLM_CONTEXT_WINDOW_TOKENS, an agent's `context.window_tokens`) or
learned from the server: most say it in the refusal of an oversized prompt ("maximum context
length is 1024 tokens"), and a llama.cpp-based one answers a streamed oversized prompt with an
empty stream, from which at least an upper bound follows (docs/real-llm-notes.md). Learned
windows live in this process's memory, per model: a restart starts over, conservatively.

Tokens are estimated from the text's script, erring on the side of more tokens: a CJK
character as 2.5 tokens (SmolLM2's tokenizer splits most in two, some in three; larger
vocabularies take one), anything else as a token per 3 characters (English prose runs 4-6
characters per token). Once a call's prompt tokens are known (its `usage`, or the figure in a
refusal), the estimate is corrected per model and script by learned factors (`tokens_learn`),
fitted to every reading at once so a mixed prompt teaches each script its own part, and
applied with a margin."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("chat.llm")

_CJK = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
# Until a model's usage says otherwise, a CJK character is taken at the dear end of what
# tokenizers charge: SmolLM2's splits most in two and some in three (at n_ctx 1024 a Chinese
# turn estimated at 2 a character overflowed), larger vocabularies take one. Overstating costs
# context; understating costs an overflow and a retry.
CJK_TOKENS_PER_CHAR = 2.5
OTHER_CHARS_PER_TOKEN = 3.0
SCRIPTS = ("cjk", "other")
# An oversized prompt refused with a figure in the message.
_WINDOW_IN_ERROR = re.compile(
    r"(?:maximum context length is|context window of|context size of|n_ctx(?:_slot)?\s*[=:]?)"
    r"\s*(\d{3,9})",
    re.IGNORECASE,
)
# ... and what the prompt took by the server's count ("you requested 1551 tokens (1531 in the
# messages, 20 in the completion)", "your messages resulted in 1531 tokens", "Requested tokens
# (1531) exceed"): the messages' figure when there is one.
_PROMPT_IN_ERROR = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"(\d{1,9}) in the messages",
        r"messages resulted in (\d{1,9}) tokens",
        r"requested tokens \((\d{1,9})\)",
        r"requested (\d{1,9}) tokens",
    )
)

_learned: dict[str, int] = {}
# Per model and script ("cjk", "other"): the provider's own prompt_tokens over our estimate of
# that script's part of the prompt, for the scripts the readings have shown enough of. The
# estimate knows scripts, the factors know the tokenizer: SmolLM2 takes ~5.7 English characters
# per token (our guess is 3) but ~2 tokens per Chinese character, so one factor for both would
# be wrong for both. Worked out from `_readings`.
_factor: dict[tuple[str, str], float] = {}
# Per model: an exponential average of the readings' least-squares terms, each reading taken in
# shares of its own estimate (c, o: the CJK and other parts' shares; r: reported over estimated):
# [c*c, c*o, o*o, c*r, o*r]. A mixed prompt's reading is split between the scripts by fitting
# both factors to every reading at once, not filed whole under the script most of it is in
# (which charged an under-estimated Chinese part to English, and left Chinese under-estimated).
_readings: dict[str, list[float]] = {}
_lock = threading.Lock()
# Each new reading moves the average this far: a few replies settle it, one odd prompt
# (mostly whitespace, say) does not swing it.
_FACTOR_WEIGHT = 0.3
# Readings outside this are not a tokenizer but a mistake (usage of another request, a proxy
# that counts differently): ignored.
_FACTOR_RANGE = (0.2, 5.0)
# How firmly a factor holds where it is (the default guess, 1.0, until learned) against the
# readings: enough to keep a script a reading barely shows where it was, little enough that a
# script's own readings set its factor (a pure one moves it 98% of the way).
_PRIOR_WEIGHT = 0.02
# A script counts as learned once the readings' average share of it, squared, reaches this (a
# reading a fifth in that script, or several with less).
_EVIDENCE = 0.04
# Learned factors are applied with this margin: a template's hidden tokens and the variance
# between one prompt and the next are not in the average.
FACTOR_MARGIN = 1.1


def _parts(text: str) -> tuple[float, float]:
    """Estimated tokens of the CJK characters and of the rest, before any learning."""
    cjk = len(_CJK.findall(text))
    return cjk * CJK_TOKENS_PER_CHAR, (len(text) - cjk) / OTHER_CHARS_PER_TOKEN


def tokens_estimate(text: str, *, model: str = "") -> int:
    """Tokens `text` takes: by script, each corrected by what `model`'s usage has taught."""
    cjk, other = _parts(text)
    return int(cjk * _applied(model, "cjk") + other * _applied(model, "other")) + 1


def _applied(model: str, script: str) -> float:
    known = _factor.get((model, script))
    return 1.0 if known is None else known * FACTOR_MARGIN


def _solve(sums: list[float], *, prior: tuple[float, float]) -> dict[str, float]:
    """Both factors from the averaged terms: least squares, held toward `prior` (the factors in
    force, 1.0 where none) in the directions the readings leave open. Readings that all mix the
    scripts alike say little about how to split them; what earlier, purer readings said then
    stands, instead of drifting to the default. For the scripts with evidence enough."""
    cc, co, oo, cr, orr = sums
    a11, a22 = cc + _PRIOR_WEIGHT, oo + _PRIOR_WEIGHT
    b1, b2 = cr + _PRIOR_WEIGHT * prior[0], orr + _PRIOR_WEIGHT * prior[1]
    det = a11 * a22 - co * co  # > 0: the prior keeps it so
    low, high = _FACTOR_RANGE
    solved = {
        "cjk": min(high, max(low, (b1 * a22 - co * b2) / det)),
        "other": min(high, max(low, (a11 * b2 - co * b1) / det)),
    }
    evidence = {"cjk": cc, "other": oo}
    return {s: f for s, f in solved.items() if evidence[s] >= _EVIDENCE}


def tokens_learn(*, model: str, text: str, reported: int) -> float | None:
    """Fold one call's prompt tokens by the server's count (`reported`) for the prompt `text`
    into `model`'s factors. Returns the factor now in force for the script most of the text is
    in, or None when the reading was ignored."""
    cjk, other = _parts(text)
    total = cjk + other
    if reported <= 0 or total <= 0:
        return None
    ratio = reported / total
    if not _FACTOR_RANGE[0] <= ratio <= _FACTOR_RANGE[1]:
        return None
    c, o = cjk / total, other / total
    terms = [c * c, c * o, o * o, c * ratio, o * ratio]
    main = "cjk" if cjk >= other else "other"
    with _lock:
        known = _readings.get(model)
        if known is None:
            known = _readings[model] = terms
        else:
            for i, term in enumerate(terms):
                known[i] += _FACTOR_WEIGHT * (term - known[i])
        prior = (_factor.get((model, "cjk"), 1.0), _factor.get((model, "other"), 1.0))
        solved = _solve(known, prior=prior)
        for script in SCRIPTS:
            if script in solved:
                _factor[(model, script)] = solved[script]
            else:
                _factor.pop((model, script), None)
        return _factor.get((model, main))


def tokens_from_error(message: str) -> int | None:
    """The prompt's tokens by the server's count, as a refusal states them, or None."""
    for pattern in _PROMPT_IN_ERROR:
        found = pattern.search(message)
        if found:
            return int(found.group(1))
    return None


def window_from_error(message: str) -> int | None:
    """The window a refusal names, or None."""
    found = _WINDOW_IN_ERROR.search(message)
    return int(found.group(1)) if found else None


def window_record_stated(*, model: str, tokens: int) -> int:
    """Record a window the server stated for `model` (in a refusal or /v1/models), keeping the
    smallest stated; returns that smallest."""
    with _lock:
        known = _learned.get(model)
        if known is None or tokens < known:
            _learned[model] = tokens
        return _learned[model]


# Per model: prompts a server refused without naming its window, as estimated token parts
# (CJK, other) before learning. The window is below each; how far below is worked out again
# with the factors known now, so an overflow met before the tokenizer was learned (our default
# guess overestimates English tokens by ~1.3-1.9x) stops overstating the window once it is.
_overflows: dict[str, list[tuple[float, float]]] = {}
# The window is taken as this share of the smallest refused prompt: it was over by some amount.
OVERFLOW_SHARE = 0.8


def window_record_overflow(*, model: str, text: str) -> int:
    """Remember that a prompt `text` did not fit `model`'s window (the server did not say by how
    much); the window now in force."""
    with _lock:
        seen = _overflows.setdefault(model, [])
        seen.append(_parts(text))
        # The smallest few are all that can matter.
        seen.sort(key=lambda p: p[0] + p[1])
        del seen[5:]
    learned = window_learned_get(model=model)
    assert learned is not None
    return learned


def window_learned_get(*, model: str) -> int | None:
    """The window in force for `model`: the smallest stated (in a refusal or /v1/models) and
    what refused prompts imply, at the factors known now."""
    found = [_learned[model]] if model in _learned else []
    for cjk, other in _overflows.get(model, ()):
        tokens = cjk * _applied(model, "cjk") + other * _applied(model, "other")
        found.append(max(1, int(tokens * OVERFLOW_SHARE)))
    return min(found) if found else None


# Where servers state a model's window in /v1/models: vLLM's `max_model_len`; LM Studio,
# OpenRouter and others' `context_length`; llama.cpp-style `meta.n_ctx`. Not `n_ctx_train`:
# that is what the model was trained with, and the server may run it with less.
_WINDOW_FIELDS = ("max_model_len", "context_length", "context_window", "n_ctx")


def window_from_models(listing: Any, *, model: str) -> int | None:
    """The window a /v1/models listing gives for `model` (or for its only model: llama.cpp
    servers serve one model under their file's name, whatever name the client asks for)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in data if isinstance(c, dict)]
    named = [c for c in cards if c.get("id") == model] or (cards if len(cards) == 1 else [])
    for card in named:
        for where in (card, card.get("meta")):
            if not isinstance(where, dict):
                continue
            for field in _WINDOW_FIELDS:
                value = where.get(field)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 256:
                    return value
    return None


_asked: set[str] = set()


def window_probe_start(*, model: str, fetch: Callable[[], Any]) -> None:
    """Ask the server for `model`'s window once per process, in the background: `fetch`
    returns its /v1/models listing (or raises). A stated window is learned like a refused
    one; until it arrives, and if the server says nothing, sends go on as before."""
    with _lock:
        if model in _asked:
            return
        _asked.add(model)

    def ask() -> None:
        try:
            found = window_from_models(fetch(), model=model)
        except Exception as exc:  # any failure only means "not stated"
            logger.info("llm_window_discovery_failed model=%s error=%s", model, str(exc)[:200])
            return
        if found:
            window_record_stated(model=model, tokens=found)
            logger.info("llm_window_discovered model=%s window_tokens=%d", model, found)

    threading.Thread(target=ask, name="cadau-window-discovery", daemon=True).start()


def reply_reserve_tokens(window: int) -> int:
    """Room left for the reply in a window of `window` tokens."""
    return max(64, min(1024, window // 4))
