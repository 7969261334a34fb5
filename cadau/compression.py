"""Compressed responses: pages and JSON with gzip, static files with Brotli or gzip, the event
stream never.

Dynamic responses: Django's own GZipMiddleware, which already does the hard parts (Vary,
ETag weakening, skipping bodies under 200 bytes or already encoded, and random padding in the
gzip header against BREACH-style length probing of a page that carries a CSRF token). It is
held back from every streaming response: it would compress those too, and a compressed event
stream is buffered by zlib until a block fills, so tokens would arrive in lumps seconds late.
Brotli is not used here: it has no such padding.

Static files: WhiteNoise serves a file's `.br`/`.gz` sibling to a browser that accepts it, but
the app serves straight from its source folders (no collectstatic), where such siblings would
go stale the moment a script is edited. So the compressed copies live in a cache folder named
by the content's hash, made when WhiteNoise first indexes the file: an edited file gets new
copies, an unchanged one reuses them across restarts.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import Any
from wsgiref.headers import Headers

import brotli
from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.gzip import GZipMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.responders import MissingFileError, StaticFile

# What is worth compressing; fonts, images and archives are compressed already.
# Source maps are left out: only the devtools fetch them, and the API docs' are megabytes.
COMPRESSIBLE_SUFFIXES = {".js", ".mjs", ".css", ".html", ".json", ".svg", ".txt", ".md"}
# Brotli quality 9 for files up to 32 KB (the page's own; 11 would be 9% smaller but ten
# times slower, and the first start compresses the admin's and API docs' files too), a
# quick quality 5 for the big bundles: about 4 s for all of them on a first start.
BEST_QUALITY_MAX_BYTES = 32 * 1024
# A copy smaller by less than this is not worth a second file (WhiteNoise's own rule).
MIN_SAVING = 0.05


class CompressionMiddleware(GZipMiddleware):
    """gzip for pages and JSON; never for a streaming response (events, files)."""

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if response.streaming or response.get("Content-Type", "").startswith("text/event-stream"):
            return response
        result: HttpResponseBase = super().process_response(request, response)
        return result


def compressed_copies(*, path: str, cache_dir: Path) -> dict[str, str]:
    """{"br": ..., "gzip": ...}: the cached compressed copies of the file at `path` that are
    worth sending, made now if missing. Empty for a file not worth compressing."""
    if Path(path).suffix.lower() not in COMPRESSIBLE_SUFFIXES:
        return {}
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:32]
    copies = {}
    best = len(data) <= BEST_QUALITY_MAX_BYTES
    for encoding, suffix, compress in (
        ("br", ".br", lambda raw: brotli.compress(raw, quality=9 if best else 5)),
        # mtime=0: the same bytes for the same file, so a rebuilt copy has the same ETag.
        ("gzip", ".gz", lambda raw: gzip.compress(raw, compresslevel=9 if best else 6, mtime=0)),
    ):
        target = cache_dir / f"{digest}{suffix}"
        if not target.exists():
            packed = compress(data)
            if len(packed) > len(data) * (1 - MIN_SAVING):
                continue
            cache_dir.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            partial.write_bytes(packed)
            # Atomic: two processes starting at once never serve half a file.
            partial.replace(target)
        copies[encoding] = str(target)
    return copies


class CompressingWhiteNoise(WhiteNoiseMiddleware):
    """WhiteNoise whose alternatives for a file are its cached compressed copies."""

    def get_static_file(self, path: str, url: str, stat_cache: Any = None) -> StaticFile:
        # WhiteNoise's own method, but for where the encodings are.
        if stat_cache is None and not os.path.exists(path):
            raise MissingFileError(path)
        headers = Headers([])
        self.add_mime_headers(headers, path, url)
        self.add_cache_headers(headers, path, url)
        if self.allow_all_origins:
            headers["Access-Control-Allow-Origin"] = "*"
        if self.add_headers_function is not None:
            self.add_headers_function(headers, path, url)
        copies = compressed_copies(path=path, cache_dir=settings.STATIC_COMPRESSED_DIR)
        if stat_cache is not None:
            # WhiteNoise stats every alternative through the cache it built for the sources.
            for copy in copies.values():
                stat_cache[copy] = os.stat(copy)
        return StaticFile(path, headers.items(), stat_cache=stat_cache, encodings=copies)
