"""Size limits, so that a long module or function is split by what it does before it grows
further: no tracked module (Python, JavaScript, CSS; migrations and translations excepted) past
500 lines, anywhere in the repository (tests, bench/ and devtools/ included), and no Python
function of the product packages past 80 lines. JavaScript is counted per file only."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MODULE_SUFFIXES = (".py", ".js", ".css")
PRODUCT_PACKAGES = ("chat", "agentmemory", "cadau", "devtools", "bench")


def _tracked(*suffixes: str) -> list[str]:
    """Tracked files with these suffixes, as paths relative to the repository's root."""
    try:
        run = subprocess.run(
            ["git", "ls-files", "-z", *[f"*{suffix}" for suffix in suffixes]],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"needs a git checkout to list the tracked files ({exc})")
    paths = [p for p in run.stdout.decode().split("\0") if p]
    return sorted(p for p in paths if _counted(p) and (ROOT / p).is_file())


def _counted(path: str) -> bool:
    parts = Path(path).parts
    return "migrations" not in parts and "locale" not in parts


def _long_functions() -> dict[str, tuple[str, int]]:
    """`path::name` -> (qualified name, lines, from `def` to the last line) of every function
    of the product packages past the limit."""
    found: dict[str, tuple[str, int]] = {}
    for path in _tracked(".py"):
        if Path(path).parts[0] not in PRODUCT_PACKAGES:
            continue
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
        for qualname, node in _functions(tree, prefix=""):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found[f"{path}::{node.name}"] = (f"{path}::{qualname}", lines)
    return found


def _functions(
    node: ast.AST, *, prefix: str
) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function under `node`, nested ones and methods included, with its dotted name."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + child.name, child))
            found += _functions(child, prefix=f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            found += _functions(child, prefix=f"{prefix}{child.name}.")
        else:
            found += _functions(child, prefix=prefix)
    return found


def test_no_module_is_past_500_lines():
    too_long = {}
    for path in _tracked(*MODULE_SUFFIXES):
        lines = len((ROOT / path).read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            too_long[path] = lines
    assert not too_long, "\n".join(
        f"{path}: {lines} lines (limit {MAX_MODULE_LINES}): split it by topic"
        for path, lines in too_long.items()
    )


def test_no_product_function_is_past_80_lines():
    too_long = _long_functions()
    assert not too_long, "\n".join(
        f"{name}: {lines} lines (limit {MAX_FUNCTION_LINES}): split it into named helpers"
        for name, lines in too_long.values()
    )
