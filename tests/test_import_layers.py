"""The import graph keeps its layers (docs/architecture.md): no module imports a layer above its
own, there are no import cycles, and plugins import only the contract.

Every ``import`` statement counts, inside functions and ``if TYPE_CHECKING:`` blocks too (a
type-only reference still names what it depends on); only cycles are judged on the imports that
run (type-only ones excluded), as that is what Python executes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "src"
PLUGINS = sorted((ROOT / "plugins").glob("*/src"))

# Layers of the core, top to bottom; a module belongs to the first prefix it matches.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("ironlm.cli", "ironlm.commands", "ironlm.builtin_plugin")),
    ("entrypoints", ("ironlm.entrypoints",)),
    ("engine", ("ironlm.engine",)),
    ("executor", ("ironlm.executor",)),
    ("worker", ("ironlm.worker",)),
    ("model", ("ironlm.models", "ironlm.model_loader", "ironlm.layers", "ironlm.attention",
               "ironlm.quantization", "ironlm.lora", "ironlm.spec_decode", "ironlm.distributed")),
    ("contract", ("ironlm.hookspecs", "ironlm.interfaces", "ironlm.config",
                  "ironlm.config_aliases",
                  "ironlm.sampling_params", "ironlm.pooling_params", "ironlm.guided_spec",
                  "ironlm.outputs",
                  "ironlm.plugin_manager", "ironlm.plugin_selection", "ironlm.registry",
                  "ironlm.contract_version",
                  "ironlm.json_scan", "ironlm.python_file")),
]
CONTRACT = len(LAYERS) - 1


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    typing_only: bool  # inside ``if TYPE_CHECKING:``


def module_name(file: Path, src_root: Path) -> str:
    parts = list(file.relative_to(src_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(file: Path, src_root: Path, prefix: str) -> list[Edge]:
    """Every import of a module starting with ``prefix`` made by ``file``."""
    src = module_name(file, src_root)
    tree = ast.parse(file.read_text(), str(file))
    typing_lines = _type_checking_lines(tree)
    edges = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                pkg = src.split(".")
                is_pkg = file.name == "__init__.py"
                pkg = pkg[: len(pkg) - node.level + (1 if is_pkg else 0)]
                base = ".".join(pkg + ([base] if base else []))
            # ``from pkg import sub`` imports pkg.sub when sub is a module
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t == prefix or t.startswith(prefix + "."):
                edges.append(Edge(src, t, node.lineno, node.lineno in typing_lines))
    return edges


def core_modules() -> dict[str, Path]:
    return {module_name(f, CORE): f for f in (CORE / "ironlm").rglob("*.py")}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to (an attribute import resolves to its module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def layer_of(module: str) -> int | None:
    if module == "ironlm":
        return CONTRACT  # the package: hookimpl, lazily LLM / SamplingParams
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def core_edges() -> list[Edge]:
    modules = core_modules()
    edges = []
    for file in modules.values():
        for e in imports_of(file, CORE, "ironlm"):
            dst = resolve(e.dst, modules)
            if dst is not None and dst != e.src:
                edges.append(Edge(e.src, dst, e.line, e.typing_only))
    return sorted(set(edges), key=lambda e: (e.src, e.dst, e.line))


def test_every_core_module_has_a_layer() -> None:
    unplaced = [m for m in core_modules() if layer_of(m) is None]
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"


def upward(edges: list[Edge]) -> list[str]:
    bad = []
    for e in edges:
        if e.src == "ironlm" and e.typing_only:
            # the package's facade: ``from ironlm import LLM`` is imported lazily on first use
            # (PEP 562 ``__getattr__``); its TYPE_CHECKING imports only name the types
            continue
        src, dst = layer_of(e.src), layer_of(e.dst)
        if src is not None and dst is not None and dst < src:
            bad.append(f"{e.src}:{e.line} ({LAYERS[src][0]}) imports {e.dst} ({LAYERS[dst][0]})")
    return bad


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward(core_edges()) == []


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), runtime imports only."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.typing_only:
            graph.setdefault(e.src, set()).add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_init_edge(e: Edge, modules: dict[str, Path]) -> bool:
    """A package's __init__ importing its own submodules (re-exports) is not a dependency of
    the submodules on the package."""
    return modules[e.src].name == "__init__.py" and e.dst.startswith(e.src + ".")


def test_no_import_cycles() -> None:
    modules = core_modules()
    edges = [e for e in core_edges() if not _is_package_init_edge(e, modules)]
    assert cycles(edges) == []


@pytest.mark.parametrize("src_root", PLUGINS, ids=lambda p: p.parent.name)
def test_plugins_import_only_the_contract(src_root: Path) -> None:
    modules = core_modules()
    bad = []
    for file in src_root.rglob("*.py"):
        for e in imports_of(file, src_root, "ironlm"):
            if e.dst.split(".")[0] != "ironlm":
                continue  # ironlm_cpu, ironlm_cuda, ...: the plugin's own modules
            dst = resolve(e.dst, modules)
            if dst is None or layer_of(dst) != CONTRACT:
                bad.append(f"{e.src}:{e.line} imports {e.dst}")
    assert bad == []


def test_the_core_does_not_import_the_benchmarks() -> None:
    """ironlm-bench (benchmarks/) builds on the core and adds ``ironlm bench`` through the
    entry-point group ``ironlm.commands``; the core never names it."""
    bad = [f"{e.src}:{e.line} imports {e.dst}" for file in core_modules().values()
           for e in imports_of(file, CORE, "ironlm_bench")]
    assert bad == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The checker itself: an upward import and a cycle are reported."""
    edges = [Edge("ironlm.worker.x", "ironlm.engine.y", 3, True),
             Edge("ironlm.models.a", "ironlm.models.b", 1, False),
             Edge("ironlm.models.b", "ironlm.models.a", 1, False),
             Edge("ironlm.layers.c", "ironlm.layers.d", 1, True),
             Edge("ironlm.layers.d", "ironlm.layers.c", 1, False)]
    assert upward(edges) == ["ironlm.worker.x:3 (worker) imports ironlm.engine.y (engine)"]
    assert cycles(edges) == [["ironlm.models.a", "ironlm.models.b"]]
