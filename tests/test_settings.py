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
        {"REDIS_URL": "redis://127.0.0.1:6379/0", "DATABASE_URL": "sqlite:////tmp/cadau-x.db"},
        "s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0]['max_connections'], "
        "s.DATABASES['default']['CONN_MAX_AGE'], s.DATABASES['default']['CONN_HEALTH_CHECKS']",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "60", "True"]


def test_the_redis_layer_holds_the_load_and_forgets_dead_channels():
    """channels-redis's default capacity (100 messages a process) dropped group messages
    under the documented load, and its group expiry (a day) kept dead processes' channels."""
    done = _settings_in_child(
        {"REDIS_URL": "redis://127.0.0.1:6379/0"},
        "s.CHANNEL_LAYERS['default']['CONFIG']['capacity'], "
        "s.CHANNEL_LAYERS['default']['CONFIG']['group_expiry']",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["20000", "300"]
    low = _settings_in_child({"REDIS_URL": "redis://x:6379/0", "CHANNEL_LAYER_CAPACITY": "5"}, "1")
    assert "ImproperlyConfigured: CHANNEL_LAYER_CAPACITY" in low.stderr


def test_postgresql_gets_a_connection_pool_and_no_persistent_connections():
    done = _settings_in_child(
        {"DATABASE_URL": "postgres://u@127.0.0.1:5432/x", "DB_POOL_MAX_SIZE": "7"},
        "s.DATABASES['default']['OPTIONS']['pool']['max_size'], "
        "s.DATABASES['default']['CONN_MAX_AGE']",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["7", "0"]
    off = _settings_in_child(
        {"DATABASE_URL": "postgres://u@127.0.0.1:5432/x", "DB_POOL": "false"},
        "'pool' in s.DATABASES['default'].get('OPTIONS', {}), "
        "s.DATABASES['default']['CONN_MAX_AGE']",
    )
    assert off.stdout.split() == ["False", "60"]


@pytest.mark.parametrize(
    "name",
    [
        "REDIS_MAX_CONNECTIONS",
        "DB_CONN_MAX_AGE",
        "DB_POOL_MAX_SIZE",
        "DB_POOL_TIMEOUT_SECONDS",
        "HTTP_THREADS",
        "CHANNEL_LAYER_CAPACITY",
        "CHANNEL_GROUP_EXPIRY_SECONDS",
        "CHAT_REPLY_LEASE_SECONDS",
    ],
)
def test_bad_integer_settings_name_the_key(name):
    env = {"REDIS_URL": "redis://127.0.0.1:6379/0", name: "lots"}
    if name.startswith("DB_POOL"):
        env["DATABASE_URL"] = "postgres://u@127.0.0.1:5432/x"
    done = _settings_in_child(env, "1")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr


@pytest.mark.parametrize(
    ("env", "expr", "expected"),
    [
        ({}, "s.LANGUAGE_CODE, s.TIME_ZONE, s.CHAT_SUMMARY_HEADING", "en UTC auto"),
        (
            {
                "LANGUAGE_CODE": "zh-Hans",
                "TIME_ZONE": "Asia/Shanghai",
                "CHAT_SUMMARY_HEADING": "ZH",
            },
            "s.LANGUAGE_CODE, s.TIME_ZONE, s.CHAT_SUMMARY_HEADING",
            "zh-hans Asia/Shanghai zh",
        ),
    ],
)
def test_language_time_zone_and_summary_heading_come_from_the_environment(env, expr, expected):
    done = _settings_in_child(env, expr)
    assert done.returncode == 0, done.stderr
    assert " ".join(done.stdout.split()) == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LANGUAGE_CODE", "fr"),
        ("LANGUAGE_CODE", "zh"),  # LANGUAGES lists zh-hans; "zh" alone has no translation
        ("TIME_ZONE", "Mars/Olympus"),
        ("TIME_ZONE", "UTC+8"),
        ("TIME_ZONE", "Europe"),  # a folder of the tz database: was IsADirectoryError
        ("TIME_ZONE", "../etc/passwd"),
        ("CHAT_SUMMARY_HEADING", "chinese"),
    ],
)
def test_bad_language_time_zone_or_heading_stop_start_up(name, value):
    done = _settings_in_child({name: value}, "1")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr


def _settings_in_dir(cwd, env: dict[str, str], expr: str) -> subprocess.CompletedProcess[str]:
    """Like _settings_in_child, started in `cwd` (the worktree stays importable)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = {k: v for k, v in os.environ.items() if k != "CADAU_CONFIG"}
    full.update({"SECRET_KEY": "x" * 50, "PYTHONPATH": root, **env})
    code = f"import cadau.settings as s; print({expr})"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_mindlink_json_in_the_working_directory_is_read_when_cadau_config_is_unset(tmp_path):
    (tmp_path / "mindlink.json").write_text(
        json.dumps({"model": "ignored", "chat_context": {"input_budget_runes": 30000}}),
        encoding="utf-8",
    )
    expr = "s.CADAU_CONFIG, s.CHAT_CONTEXT.input_budget_runes"
    found = _settings_in_dir(tmp_path, {}, expr)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(tmp_path / "mindlink.json"), "30000"]
    # CADAU_CONFIG wins over the working directory's file.
    other = tmp_path / "other.json"
    other.write_text('{"chat_context": {"input_budget_runes": 20000}}', encoding="utf-8")
    named = _settings_in_dir(tmp_path, {"CADAU_CONFIG": str(other)}, expr)
    assert named.stdout.split() == [str(other), "20000"]
    # Set but empty: no file at all.
    off = _settings_in_dir(
        tmp_path, {"CADAU_CONFIG": ""}, "repr(s.CADAU_CONFIG), s.CHAT_CONTEXT.input_budget_runes"
    )
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["''", "48000"]
    # A bad mindlink.json stops start-up naming the file, as a bad CADAU_CONFIG file does.
    (tmp_path / "mindlink.json").write_text('{"chat_context": {"roll_batch": "x"}}')
    bad = _settings_in_dir(tmp_path, {}, "1")
    assert bad.returncode != 0 and "mindlink.json chat_context: roll_batch" in bad.stderr


def test_no_mindlink_json_no_file(tmp_path):
    from cadau.contextconfig import config_path_find

    assert config_path_find(environ={}, cwd=tmp_path) is None
    (tmp_path / "mindlink.json").mkdir()  # a directory of that name is not the file
    assert config_path_find(environ={}, cwd=tmp_path) is None
    assert config_path_find(environ={"CADAU_CONFIG": " /x.json "}, cwd=tmp_path) == "/x.json"


def test_embeddings_off_by_default_and_inherit_the_chat_server():
    done = _settings_in_child({}, "repr(s.LLM_EMBEDDING_MODEL)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "''"
    done = _settings_in_child(
        {
            "LLM_BASE_URL": "http://127.0.0.1:9/v1/",
            "LLM_API_KEY": "chat-key",
            "LLM_EMBEDDING_MODEL": "nomic",
        },
        "s.LLM_EMBEDDING_BASE_URL, s.LLM_EMBEDDING_API_KEY, s.LLM_EMBEDDING_BATCH",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["http://127.0.0.1:9/v1", "chat-key", "32"]


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"LLM_EMBEDDING_MODEL": "nomic"}, "LLM_EMBEDDING_BASE_URL"),
        (
            {"LLM_EMBEDDING_MODEL": "nomic", "LLM_EMBEDDING_BASE_URL": "ftp://x"},
            "LLM_EMBEDDING_BASE_URL",
        ),
        ({"LLM_EMBEDDING_BATCH": "0"}, "LLM_EMBEDDING_BATCH"),
        ({"LLM_EMBEDDING_DIMENSIONS": "many"}, "LLM_EMBEDDING_DIMENSIONS"),
        ({"LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS": "0"}, "LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS"),
        ({"LLM_EMBEDDING_TIMEOUT_SECONDS": "soon"}, "LLM_EMBEDDING_TIMEOUT_SECONDS"),
    ],
)
def test_embedding_settings_are_parsed_strictly(env, needle):
    done = _settings_in_child({"LLM_BASE_URL": "", **env}, "1")
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and needle in done.stderr


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_a_bad_summary_timeout_stops_start_up(value):
    done = _settings_in_child({"LLM_SUMMARY_TIMEOUT_SECONDS": value}, "1")
    assert done.returncode != 0
    assert "ImproperlyConfigured: LLM_SUMMARY_TIMEOUT_SECONDS" in done.stderr


def test_the_summary_timeout_defaults_to_three_minutes_and_is_read_from_the_environment():
    assert _settings_in_child({}, "s.LLM_SUMMARY_TIMEOUT_SECONDS").stdout.split() == ["180.0"]
    done = _settings_in_child(
        {"LLM_SUMMARY_TIMEOUT_SECONDS": "600"}, "s.LLM_SUMMARY_TIMEOUT_SECONDS"
    )
    assert done.stdout.split() == ["600.0"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # Each started the server, which then failed on use (a probe's second instance).
        ("LLM_TIMEOUT_SECONDS", "-3"),
        ("LLM_TIMEOUT_SECONDS", "nan"),
        ("LLM_TIMEOUT_SECONDS", "inf"),
        ("LLM_CONNECT_TIMEOUT_SECONDS", "-1"),
        ("LLM_MAX_RETRIES", "-1"),
        ("LLM_RETRY_BACKOFF_SECONDS", "-0.5"),
        ("CHAT_SEND_QUEUE_SECONDS", "-1"),
        ("DB_CONN_MAX_AGE", "-5"),
        ("REDIS_URL", "notaurl"),
        ("LOG_LEVEL", "LOUD"),
        ("DATABASE_URL", "mysql://u@h/x"),
    ],
)
def test_values_that_would_fail_later_stop_start_up_naming_the_key(name, value):
    done = _settings_in_child({name: value}, "1")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}" in done.stderr, done.stderr[-500:]


def test_an_empty_runtime_dir_or_log_level_is_the_default_not_the_working_directory(tmp_path):
    # RUNTIME_DIR="" was the working directory: agents' memory went into the project tree.
    done = _settings_in_child({"RUNTIME_DIR": "", "LOG_LEVEL": ""}, "s.RUNTIME_DIR, s.LOG_LEVEL")
    assert done.returncode == 0, done.stderr
    runtime, level = done.stdout.split()
    assert runtime.endswith("/runtime") and level == "INFO"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        # Each started, then failed every request or took a value it could not honour (a probe).
        ({"SECRET_KEY": "short-but-set"}, "SECRET_KEY: must be at least 50 characters, got 13"),
        ({"ALLOWED_HOSTS": "", "DEBUG": "false"}, "ALLOWED_HOSTS: empty"),
        ({"HTTP_THREADS": "80000"}, "HTTP_THREADS: must be <= 256, got 80000"),
        ({"CHAT_MAX_MESSAGE_RUNES": "3000000"}, "CHAT_MAX_MESSAGE_RUNES: 3000000 is more than"),
        (
            {"CHAT_MAX_MESSAGE_RUNES": "5000", "WS_MAX_FRAME_BYTES": "4096"},
            "CHAT_MAX_MESSAGE_RUNES: 5000 is more than",
        ),
    ],
)
def test_settings_the_app_could_not_honour_stop_start_up(env, needle):
    done = _settings_in_child(env, "1")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {needle}" in done.stderr, done.stderr[-500:]


def test_an_empty_allowed_hosts_is_fine_under_debug_and_limits_may_be_raised_together():
    # DEBUG lets localhost in on its own; a message limit goes up with the body caps.
    done = _settings_in_child(
        {
            "ALLOWED_HOSTS": "",
            "DEBUG": "true",
            "CHAT_MAX_MESSAGE_RUNES": "3000000",
            "HTTP_MAX_BODY_BYTES": "40000000",
            "WS_MAX_FRAME_BYTES": "40000000",
            "HTTP_THREADS": "256",
        },
        "s.ALLOWED_HOSTS, s.CHAT_MAX_MESSAGE_RUNES, s.HTTP_THREADS",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "3000000", "256"]
