"""The import graph of ``src/`` points one way: no circle, no import running back up the layers.

Every import counts, at module level and inside function bodies alike; ``if TYPE_CHECKING:``
blocks are type hints, not imports, and are left out. The layers follow the data flow of
docs/architecture.md: a module may import its own layer and the layers below it, never one
above, and the lab (``ganda_lab``) is a client that nothing in ``ganda`` imports.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# lowest first; a module takes the layer of the longest listed prefix of its dotted name
LAYERS: list[tuple[str, ...]] = [
    ("ganda.errors", "ganda.device", "ganda.stats", "ganda.runio", "ganda.registry", "ganda.progress", "ganda.options",
     "ganda.fingerprint", "ganda.finite", "ganda.intervals", "ganda.effects"),
    ("ganda.heads",),
    ("ganda.models",),
    ("ganda.engine",),
    ("ganda.interventions",),
    ("ganda.tasks", "ganda.sites"),
    ("ganda.scoring", "ganda.generation", "ganda.lmeval", "ganda.figures", "ganda.ablation"),
    ("ganda.evaluation", "ganda.acts", "ganda.prepared", "ganda.attention", "ganda.patterns", "ganda.labels", "ganda.knowledge"),
    ("ganda.sweep", "ganda.attribution", "ganda.plan", "ganda.circuit"),
    ("ganda.experiments", "ganda.distributed", "ganda.grid"),
    ("ganda.report", "ganda.demo", "ganda.results"),
    ("ganda.commands", "ganda.cli", "ganda.__main__", "ganda"),
    ("ganda_lab",),
]
# imports allowed inside a function body: optional or heavy dependencies, loaded only when used
# (fcntl: absent on Windows, where the cache lock falls back to unique names)
LAZY_OK = ("lm_eval", "matplotlib", "ray", "accelerate", "huggingface_hub", "nbclient", "pandas", "scipy",
           "gguf", "transformers", "mamba_ssm", "fcntl", "jinja2", "markupsafe")
# modules that import ganda's library inside the command that needs it (start-up of ``ganda --help``)
COMMAND_LAYER = ("ganda.commands", "ganda.cli")
# packages that serve some names on first use (a module ``__getattr__``), so that importing the
# package costs nothing: ``ganda --help`` lists the registered experiments without torch
LAZY_PACKAGES = ("ganda.experiments",)


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".")
        if not MODULES[module].name == "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


@cache
def _imports() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, inside a function body, line) for every import of a module of src/."""
    out = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        hidden = _type_checking_lines(tree)
        in_function = {
            n.lineno
            for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in hidden:
                for target in _targets(module, node):
                    out.append((module, target, node.lineno in in_function, node.lineno))
    return out




def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_runs_back_up():
    up = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)}) at line {line}"
        for a, b, _, line in _imports()
        if b.split(".")[0] in ("ganda", "ganda_lab") and b in MODULES and _layer(b) > _layer(a)
    ]
    assert up == []


def test_the_core_never_imports_the_lab():
    assert [f"{a}:{line}" for a, b, _, line in _imports() if a.startswith("ganda.") and b.startswith("ganda_lab")] == []


def test_no_import_circle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in _imports():
        if b in MODULES and b != a and not a.startswith(b + "."):  # a package's own __init__ is its parent
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_function_body_imports_are_optional_dependencies_only():
    """In the core, a function-body import is for an optional or heavy dependency only. The command
    layer is the exception: a command imports the library (and with it torch) when it runs, so that
    ``ganda --help`` stays quick, as the lab's command module defers its training stack."""
    hidden = [
        f"{a}:{line} imports {b}"
        for a, b, inside, line in _imports()
        if inside and a.startswith("ganda.") and not b.startswith(LAZY_OK)
        and not a.startswith(COMMAND_LAYER) and a not in LAZY_PACKAGES
    ]
    assert hidden == []
