"""Rolling-context configuration: the `CHAT_CONTEXT_*` knobs.

Precedence (lowest to highest): built-in defaults, environment variables, the `chat_context`
section of the JSON file named by `CADAU_CONFIG`, or else of `mindlink.json` in the working
directory (the seed's file: it overrides the environment, as the seed specifies), then per-agent
overrides in `Agent.config_json` (`context` key). Every value is validated; a bad one raises
ImproperlyConfigured naming the key, so a typo stops start-up instead of silently running with
a default.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

ENV_PREFIX = "CHAT_CONTEXT_"
STRATEGIES = ("cadau", "seed")


@dataclass(frozen=True, slots=True)
class ContextConfig:
    input_budget_runes: int = 48_000
    threshold_pct: int = 88
    target_pct: int = 60
    # 0 means "same as the input budget".
    hard_limit_runes: int = 0
    roll_batch: int = 4
    min_verbatim: int = 4
    max_rounds: int = 48
    history_read_limit: int = 8000
    summary_max_runes: int = 6000
    strategy: str = "cadau"
    # The model's context window in tokens (0: not configured; the engine then uses what it
    # learned from the server, if anything). LLM_CONTEXT_WINDOW_TOKENS sets it too.
    window_tokens: int = 0

    @property
    def threshold_runes(self) -> int:
        return self.input_budget_runes * self.threshold_pct // 100

    @property
    def target_runes(self) -> int:
        return self.input_budget_runes * self.target_pct // 100

    @property
    def effective_hard_limit_runes(self) -> int:
        return self.hard_limit_runes or self.input_budget_runes

    @property
    def summary_cap_runes(self) -> int:
        """The summary's cap at this budget: `summary_max_runes`, but no more than an eighth of
        the budget (a 6,000-rune summary took the room of a 16,000-rune budget's turns and
        recall) unless that is under 800 runes, the least that holds its five headings and a
        few facts (a smaller budget's summary yields room per call instead, payload.py)."""
        return min(self.summary_max_runes, max(self.input_budget_runes // 8, 800))

    def with_overrides(self, overrides: Mapping[str, Any], *, source: str) -> ContextConfig:
        return _build(base=self, values=overrides, source=source)


# name -> (type, minimum, maximum)
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "input_budget_runes": (1_000, 10_000_000),
    "threshold_pct": (10, 100),
    "target_pct": (5, 100),
    "hard_limit_runes": (0, 20_000_000),
    "roll_batch": (1, 1_000),
    "min_verbatim": (1, 1_000),
    "max_rounds": (1, 1_000),
    "history_read_limit": (10, 1_000_000),
    "summary_max_runes": (200, 1_000_000),
    "window_tokens": (0, 100_000_000),
}
KNOBS = (*_INT_BOUNDS.keys(), "strategy")


def _coerce(key: str, value: Any, *, source: str) -> Any:
    label = f"{source}: {key}"
    if key == "strategy":
        if not isinstance(value, str) or value.strip().lower() not in STRATEGIES:
            raise ImproperlyConfigured(
                f"{label} must be one of {', '.join(STRATEGIES)}, got {value!r}"
            )
        return value.strip().lower()
    low, high = _INT_BOUNDS[key]
    if isinstance(value, bool):
        raise ImproperlyConfigured(f"{label} must be an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ImproperlyConfigured(f"{label} must be an integer, got {value!r}") from None
    if not isinstance(value, int):
        raise ImproperlyConfigured(f"{label} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{label} must be between {low} and {high}, got {value}")
    return value


def _build(*, base: ContextConfig, values: Mapping[str, Any], source: str) -> ContextConfig:
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise ImproperlyConfigured(f"{source}: unknown key(s) {', '.join(unknown)}")
    changes = {key: _coerce(key, value, source=source) for key, value in values.items()}
    cfg = dataclasses.replace(base, **changes)
    if cfg.target_pct >= cfg.threshold_pct:
        raise ImproperlyConfigured(
            f"{source}: target_pct ({cfg.target_pct}) must be below threshold_pct "
            f"({cfg.threshold_pct}), or every compaction would retrigger at once"
        )
    if cfg.hard_limit_runes and cfg.hard_limit_runes < cfg.threshold_runes:
        raise ImproperlyConfigured(
            f"{source}: hard_limit_runes ({cfg.hard_limit_runes}) is below the threshold "
            f"({cfg.threshold_runes} runes)"
        )
    return cfg


# Knobs whose growth costs the operator more model use; an agent of a user who is not staff
# may lower them, never raise them past the server's own values (`context_over_cap`).
COST_KNOBS = (
    "input_budget_runes",
    "history_read_limit",
    "max_rounds",
    "summary_max_runes",
    "roll_batch",
)


def context_over_cap(cfg: ContextConfig, *, cap: ContextConfig) -> list[tuple[str, Any, Any]]:
    """(knob, value, cap) for each knob of `cfg` past the server's `cap`: the cost knobs, the
    hard limit (compared as the limit in force) and the strategy (the seed's loop summarises
    on every send)."""
    over = [
        (k, getattr(cfg, k), getattr(cap, k))
        for k in COST_KNOBS
        if getattr(cfg, k) > getattr(cap, k)
    ]
    if cfg.effective_hard_limit_runes > cap.effective_hard_limit_runes:
        over.append(
            ("hard_limit_runes", cfg.effective_hard_limit_runes, cap.effective_hard_limit_runes)
        )
    if cfg.strategy != cap.strategy:
        over.append(("strategy", cfg.strategy, cap.strategy))
    return over


def context_capped(cfg: ContextConfig, *, cap: ContextConfig) -> ContextConfig:
    """`cfg` with every knob past `cap` brought back to it."""
    over = context_over_cap(cfg, cap=cap)
    if not over:
        return cfg
    changes = {key: getattr(cap, key) for key, _value, _cap in over}
    return dataclasses.replace(cfg, **changes)


#: The original's configuration file, read from the working directory when CADAU_CONFIG is unset.
DEFAULT_CONFIG_NAME = "mindlink.json"


def config_path_find(*, environ: Mapping[str, str], cwd: Path) -> str | None:
    """The configuration file to read: CADAU_CONFIG when set; else `mindlink.json` in the
    working directory when there is one, as the original looked for it (an operator moving a
    deployment over keeps its file where it was). CADAU_CONFIG set to "" reads no file at all,
    for a process that must not pick up a stray mindlink.json from where it was started."""
    explicit = environ.get("CADAU_CONFIG")
    if explicit is not None:
        return explicit.strip() or None
    candidate = cwd / DEFAULT_CONFIG_NAME
    return str(candidate) if candidate.is_file() else None


def load_chat_context(*, environ: Mapping[str, str], config_path: str | None) -> ContextConfig:
    from_env = {
        key: environ[ENV_PREFIX + key.upper()]
        for key in KNOBS
        if ENV_PREFIX + key.upper() in environ
    }
    # The window is the model's, so it also goes by the LLM_ name next to LLM_MODEL.
    if "window_tokens" not in from_env and environ.get("LLM_CONTEXT_WINDOW_TOKENS"):
        from_env["window_tokens"] = environ["LLM_CONTEXT_WINDOW_TOKENS"]
    cfg = _build(base=ContextConfig(), values=from_env, source="environment CHAT_CONTEXT_*")
    if not config_path:
        return cfg
    path = Path(config_path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImproperlyConfigured(f"CADAU_CONFIG: file {config_path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"CADAU_CONFIG: cannot read {config_path}: {exc}") from None
    if not isinstance(document, dict):
        raise ImproperlyConfigured(f"CADAU_CONFIG: {config_path} must hold a JSON object")
    section = document.get("chat_context", {})
    if not isinstance(section, dict):
        raise ImproperlyConfigured(f"CADAU_CONFIG: chat_context in {config_path} must be an object")
    return _build(base=cfg, values=section, source=f"{config_path} chat_context")
