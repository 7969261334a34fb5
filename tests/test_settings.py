import json
import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from cadau.contextconfig import ContextConfig, load_chat_context


def test_defaults_match_the_seed():
    cfg = load_chat_context(environ={}, config_path=None)
    assert cfg == ContextConfig()
    assert (cfg.threshold_pct, cfg.roll_batch, cfg.max_rounds, cfg.history_read_limit) == (
        88,
        4,
        48,
        8000,
    )
    assert cfg.strategy == "cadau"


def test_environment_sets_knobs():
    cfg = load_chat_context(
        environ={"CHAT_CONTEXT_INPUT_BUDGET_RUNES": "20000", "CHAT_CONTEXT_STRATEGY": "SEED"},
        config_path=None,
    )
    assert cfg.input_budget_runes == 20000
    assert cfg.strategy == "seed"


def test_config_file_overrides_environment(tmp_path):
    path = tmp_path / "cadau.json"
    path.write_text(json.dumps({"chat_context": {"input_budget_runes": 30000, "target_pct": 50}}))
    cfg = load_chat_context(
        environ={"CHAT_CONTEXT_INPUT_BUDGET_RUNES": "20000", "CHAT_CONTEXT_ROLL_BATCH": "6"},
        config_path=str(path),
    )
    assert cfg.input_budget_runes == 30000  # file wins
    assert cfg.roll_batch == 6  # env still applies where the file is silent
    assert cfg.target_pct == 50


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"CHAT_CONTEXT_THRESHOLD_PCT": "abc"}, "threshold_pct"),
        ({"CHAT_CONTEXT_THRESHOLD_PCT": "101"}, "threshold_pct"),
        ({"CHAT_CONTEXT_STRATEGY": "magic"}, "strategy"),
        ({"CHAT_CONTEXT_TARGET_PCT": "90"}, "target_pct"),
        ({"CHAT_CONTEXT_HARD_LIMIT_RUNES": "1000"}, "hard_limit_runes"),
    ],
)
def test_bad_values_name_the_key(environ, needle):
    with pytest.raises(ImproperlyConfigured, match=needle):
        load_chat_context(environ=environ, config_path=None)


def test_bad_config_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ImproperlyConfigured, match="does not exist"):
        load_chat_context(environ={}, config_path=str(missing))
    bad = tmp_path / "bad.json"
    bad.write_text('{"chat_context": {"roll_batch": "x"}}')
    with pytest.raises(ImproperlyConfigured, match="roll_batch"):
        load_chat_context(environ={}, config_path=str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"chat_context": {"budget": 1}}')
    with pytest.raises(ImproperlyConfigured, match="unknown key"):
        load_chat_context(environ={}, config_path=str(unknown))


def _settings_in_child(env: dict[str, str], expr: str) -> subprocess.CompletedProcess[str]:
    """Import cadau.settings in a fresh interpreter with `env` (module-level parsing)."""
    code = f"import cadau.settings as s; print({expr})"
    full = {**os.environ, "SECRET_KEY": "x" * 50, **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60
    )


def test_redis_pool_and_persistent_connections_defaults():
    done = _settings_in_child(
        {"REDIS_URL": "redis://127.0.0.1:6379/0"},
        "s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0]['max_connections'], "
        "s.DATABASES['default']['CONN_MAX_AGE'], s.DATABASES['default']['CONN_HEALTH_CHECKS']",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "60", "True"]


@pytest.mark.parametrize("name", ["REDIS_MAX_CONNECTIONS", "DB_CONN_MAX_AGE"])
def test_bad_integer_settings_name_the_key(name):
    done = _settings_in_child({"REDIS_URL": "redis://127.0.0.1:6379/0", name: "lots"}, "1")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr
