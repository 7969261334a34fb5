"""The layering of docs/architecture.md, checked on the import graph (imports inside functions
included, so a cycle cannot hide behind a deferred import): the import-linter contracts in
pyproject.toml (`make lint` runs them too) and no cycle between any two modules."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chat", "agentmemory", "cadau")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    graph = grimp.build_graph(*PACKAGES)
    assert _cycles(graph) == []


def test_the_import_contracts_hold():
    # A process of its own: import-linter reads the packages as a fresh interpreter finds them.
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_contracts_say_what_the_architecture_promises():
    """The contracts themselves, so that weakening one is a visible change: the adapters may
    not import the context engine, the model client or the raw queries, and search is a layer
    of its own between the selectors and the context engine."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    assert (
        layers.index("chat.selectors") < layers.index("chat.search") < layers.index("chat.context")
    )
    adapters = next(
        c for c in contracts if c["type"] == "forbidden" and "chat.api" in c["source_modules"]
    )
    assert {"chat.api", "chat.web", "chat.consumers", "chat.admin"} <= set(
        adapters["source_modules"]
    )
    assert set(adapters["forbidden_modules"]) == {"chat.context", "chat.llm", "chat.queries"}
