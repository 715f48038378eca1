"""The layers, enforced: who may import whom, no import cycle, and docs/architecture.md's table
saying the same. A layer is a top-level package: the folder tree is the layer diagram.

Every import counts, at module level or inside a function (a lazy import is still an arrow),
except those under `if TYPE_CHECKING:`, which never run. Bottom to top:

    core        core/ (the words every layer speaks: datasets, hashing, mapper, statuses,
                settings, errors)
    store       store/ (MetaStore and ColumnStore: SQLite, Cassandra, the chunk format)
    ingest      ingest/ (Kafka, wire formats, memstores, flushing)
    query       query/ (PromQL over memstores and the store)
    coordinator coordinator/ (the cluster runtime on Ray and its client)
    filopy      filopy/ (the shell: the `filopy` command, REST, HTTP ingestion, the public facade)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["core", "store", "ingest", "query", "coordinator", "filopy"]
PACKAGES = tuple(ORDER)
# Each layer may import its own and every layer below it.
ALLOWED = {layer: set(ORDER[: i + 1]) for i, layer in enumerate(ORDER)}


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = modules()


def layer(module: str) -> str:
    return module.split(".")[0]


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, skipping the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _own(name: str) -> str | None:
    """The FiloPy module an imported name lives in (a module, or the one defining it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        found.update(m for n in names if (m := _own(n)) is not None and m != module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_import_points_down_or_within_a_layer() -> None:
    wrong = [
        f"{m} ({layer(m)}) imports {dep} ({layer(dep)})"
        for m, deps in sorted(GRAPH.items())
        for dep in sorted(deps)
        if layer(dep) not in ALLOWED[layer(m)]
    ]
    assert wrong == []


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert cycles == []


def test_the_checker_sees_lazy_imports_and_skips_type_checking_ones() -> None:
    assert "coordinator.client" in GRAPH["filopy"]  # `filopy.connect`, imported in a function
    assert "coordinator.client" not in GRAPH["coordinator.cluster_queries"]  # TYPE_CHECKING only
    assert layer("filopy.cli.main") == "filopy" and layer("store.api") == "store"


def test_the_architecture_doc_states_the_same_layers() -> None:
    """docs/architecture.md's layer table: one row per layer, bottom last, 'may import' true."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \*\*(\w+)\*\* \|[^|]*\|[^|]*\| ([^|]*) \|$", section, re.M)
    assert [name for name, _ in rows] == ORDER[::-1]
    for name, may in rows:
        listed = {w for w in re.findall(r"\w+", may) if w in ORDER}
        assert listed == ALLOWED[name] - {name}, (name, may)
