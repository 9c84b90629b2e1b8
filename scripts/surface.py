"""The size of ganda's surface, counted from the source alone (stdlib ``ast``; nothing is imported).

Run from a checkout: ``python scripts/surface.py [--json] [--root DIR]`` (default root: this
script's checkout). Every count below is a rule over the syntax tree of ``src/ganda``, written so
that the same code gives the same numbers on any checkout:

lines
    Physical lines (``str.splitlines``) of every ``.py`` file under ``src/ganda``, and of those
    under ``src/ganda/commands``. Listed after the counts, for each top-level folder or module of
    ``src/ganda`` (``parts``): its lines, those of its docstrings (module, class and function
    docstrings, first line to last) and its blank lines, so that what a line target would take
    away can be read against what code, docstrings and spacing hold.

functions over 60 lines
    Every ``def`` / ``async def`` under ``src/ganda`` (module functions, methods and nested
    functions, e.g. typer ``register`` closures and the commands inside them, each counted on its
    own) whose span, from the ``def`` line to its last line (decorators left out), is over 60
    lines. A nested function's lines also count towards the function around it.

name tables (mapping an experiment to behaviour)
    A *name* is an experiment or result-kind name in :data:`EXPERIMENT_NAMES` (both spellings,
    ``kv_curve`` and ``kv-curve``) or the file name of one kind's output in :data:`KIND_FILES`.
    A name table is one of:

    * a dict, tuple, list or set literal written at module or class level (an assignment's value,
      or the iterable of a module-level ``for``, e.g. a loop that registers each entry), not
      inside another literal, whose names (a dict's string keys, a sequence's string items, and
      the string items of the tuples/lists it holds, so ``(("ranking.json", "rank"), ...)``
      counts once, as one table) stand for at least two different experiments (``attribution``
      is ``rank``, ``circuit_edges`` is ``edges``, a kind's file is its kind: one experiment's
      own list of files is not a table of experiments);
    * module-level calls in one module to one callee whose first argument is a name (e.g.
      ``register_experiment("sweep", ...)`` written once per experiment), naming at least two
      different experiments: one table per callee;
    * the hand-written commands: ``@<app>.command(...)`` decorators whose command name (the
      decorator's first string argument, else the function's name with ``_`` as ``-``) is a name.
      All of them together are one table (a command line generated from a registry has none).

places an option of rank or edges is declared
    The options are :data:`OPTIONS`: the flags only ``rank`` takes and those only ``edges`` takes
    (shared ones such as ``limit``, ``seed``, ``top``, ``margin`` and ``ablation`` are left out,
    since every experiment declares its own); ``rank.verify_top`` and ``edges.verify_top`` are two
    options. A place is one function or class that declares at least one of them, as

    * a parameter of a function whose default is a ``typer.Option(...)`` / ``Option(...)`` call
      (anywhere under ``src/ganda``);
    * an annotated field of a ``@dataclass`` class that is an options class (its name or a base's
      name ends in ``Options``; anywhere under ``src/ganda``) or that sits in one of the areas below;
    * plain parameters of a function in ``commands/``, ``experiments/``, ``plan.py`` or ``grid.py``
      (the layers a user's option passes through on its way to the library) that takes at least
      two of the option names: a signature that repeats an option set. One parameter that happens
      to share a name (``extends.control_heads(screen=...)``) is not a declaration of the flag, and
      the library's own functions below, e.g. ``attribution.rank_heads``, are not counted.
      Result records (a dataclass ``RankResult`` with a ``method`` field) outside the areas are
      not options and are not counted.

    A place declares rank's options when its qualified name says so (``rank`` or ``attribution``
    in it, e.g. ``RankOptions``, ``register.rank``), edges' when it says ``edge``, else when its
    file's name does; a place that names neither (``ganda plan``'s flags) declares both.
    Printed: the most places any one option of one experiment is declared in (the target is 1:
    each option declared once), and the places declaring any of them.

result readers
    Units are the top-level functions and classes (with their methods and nested functions) of
    ``src/ganda/results.py`` and ``src/ganda/report/*.py``. A unit is a *per-kind reader* when it
    holds a string literal in :data:`KIND_FILES` (one kind's own file), compares a kind with a
    name (``kind == "sweep"``, ``d.get("kind") in ("rank", ...)``: one side's source mentions
    ``kind``, the other is a name or a literal sequence holding one), or is a class that defines
    ``headline`` (an adapter that presents one kind's data as a result). A unit that names ``result.json`` and
    no kind's file is a *generic reader* (it reads every kind's result.json). Printed: per-kind
    readers, plus 1 where any generic reader exists (the target is 1: one generic reader).
"""

from __future__ import annotations

import argparse
import ast
import json
import posixpath
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

LONG = 60  # a function is long when its span is over this many lines

#: experiment and result-kind names -> the experiment they name (a command's spelling, a kind's, an alias)
EXPERIMENT_NAMES = {
    "eval": "eval", "maps": "maps", "sweep": "sweep", "rank": "rank", "attribution": "rank", "heads": "heads",
    "roles": "roles", "prune": "prune", "remove_restore": "prune", "remove-restore": "prune", "retain": "retain",
    "kv_curve": "kv_curve", "kv-curve": "kv_curve", "mask_last_row": "mask_last_row",
    "mask-last-row": "mask_last_row", "transplant": "transplant", "extends": "extends", "sharpness": "sharpness",
    "path": "path", "circuit_path": "path", "edges": "edges", "circuit_edges": "edges", "demo": "demo",
}
#: files that one kind's run writes and its readers look for -> that kind (result.json is every kind's)
KIND_FILES = {
    "results.jsonl": "sweep", "progress.jsonl": "sweep", "cumulative.json": "sweep", "ranking.json": "rank",
    "attribution.jsonl": "rank", "extends.json": "extends", "edges.json": "edges", "edges_exact.jsonl": "edges",
}
GENERIC_FILE = "result.json"
#: experiment -> the options it takes that are its own (python names), and the words that name it
OPTIONS = {
    "rank": frozenset({"method", "graddrop_blocks", "ig_steps", "verify_top", "verify_layers", "audit", "active",
                       "widen", "screen", "threshold"}),
    "edges": frozenset({"verify_top", "audit", "active", "widen", "threshold", "senders", "receivers", "show"}),
}
OPTION_OWNERS = {"rank": ("rank", "attribution"), "edges": ("edge",)}
OPTION_NAMES = frozenset().union(*OPTIONS.values())
#: where a plain function parameter of one of those names counts as a declaration (package-relative)
PARAMETER_AREAS = ("commands/", "experiments/", "plan.py", "grid.py")
READER_AREAS = ("results.py", "report/")


@dataclass
class LongFunction:
    file: str
    name: str
    line: int
    lines: int


@dataclass
class NameTable:
    file: str
    name: str
    line: int
    names: list[str] = field(default_factory=list)


@dataclass
class Reader:
    file: str
    name: str
    line: int
    why: str


def package_files(pkg: Path) -> dict[str, ast.Module]:
    """Every ``.py`` file under ``pkg`` (path relative to it, with ``/``) -> its syntax tree."""
    return {p.relative_to(pkg).as_posix(): ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
            for p in sorted(pkg.rglob("*.py"))}


def count_lines(pkg: Path, under: str = "") -> int:
    """Physical lines of the ``.py`` files under ``pkg/under``."""
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in sorted((pkg / under).rglob("*.py")))


def _docstring_lines(tree: ast.Module) -> int:
    """Lines of the module's, its classes' and its functions' docstrings."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    docs = [n.body[0] for n in nodes if n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant) and isinstance(n.body[0].value.value, str)]
    return sum(d.end_lineno - d.lineno + 1 for d in docs)  # type: ignore[operator]


def line_parts(pkg: Path, trees: dict[str, ast.Module]) -> dict[str, dict[str, int]]:
    """Each top-level folder (``name/``) or module of ``pkg`` -> its lines, docstring lines and blank
    lines, largest first."""
    parts: dict[str, dict[str, int]] = {}
    for rel, tree in trees.items():
        text = (pkg / rel).read_text(encoding="utf-8").splitlines()
        head, sep, _ = rel.partition("/")
        part = parts.setdefault(head + ("/" if sep else ""), {"lines": 0, "docstrings": 0, "blank": 0})
        part["lines"] += len(text)
        part["docstrings"] += _docstring_lines(tree)
        part["blank"] += sum(1 for line in text if not line.strip())
    return dict(sorted(parts.items(), key=lambda kv: (-kv[1]["lines"], kv[0])))


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with its qualified name (``Class.method``, ``outer.inner``), in source order."""
    out = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((prefix + node.name, node))
            out += _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, prefix + node.name + ".")
        else:
            out += _functions(node, prefix)
    return out


def span(node: ast.AST) -> int:
    """Lines from a definition's ``def``/``class`` line to its last, decorators left out."""
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def long_functions(trees: dict[str, ast.Module], limit: int = LONG) -> list[LongFunction]:
    """Functions whose span is over ``limit`` lines, longest first."""
    out = [LongFunction(f, name, node.lineno, span(node))
           for f, tree in trees.items() for name, node in _functions(tree) if span(node) > limit]
    return sorted(out, key=lambda x: (-x.lines, x.file, x.line))


def _strings(node: ast.AST | None) -> list[str]:
    return [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []


def _literal_names(node: ast.AST) -> set[str]:
    """The names a dict/sequence literal holds: a dict's keys, a sequence's items and the items of
    the tuples/lists it holds, kept where they are experiment names or kind files."""
    found: list[str] = []
    items = node.keys if isinstance(node, ast.Dict) else node.elts  # type: ignore[attr-defined]
    for item in items:
        found += _strings(item)
        if isinstance(item, (ast.Tuple, ast.List)):
            for sub in item.elts:
                found += _strings(sub)
    return {s for s in found if s in EXPERIMENT_NAMES or s in KIND_FILES}


def experiments_named(names: list[str] | set[str]) -> set[str]:
    """The distinct experiments a set of names and kind files stands for."""
    return {EXPERIMENT_NAMES.get(n) or KIND_FILES[n] for n in names}


def _outer_literals(node: ast.AST) -> list[ast.AST]:
    """The dict/sequence literals inside ``node`` that no other literal holds (no function bodies)."""
    if isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
        return [node]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return []
    return [lit for child in ast.iter_child_nodes(node) for lit in _outer_literals(child)]


def _target_name(stmt: ast.stmt) -> str:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    names = [ast.unparse(t) for t in targets if t is not None]
    return ", ".join(names) or type(stmt).__name__.lower()


def _table_statements(tree: ast.Module) -> list[tuple[str, ast.stmt, ast.AST]]:
    """(name, statement, expression holding its literals) for the module's and its classes' level."""
    out = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                out.append((prefix + _target_name(stmt), stmt, stmt.value))
            elif isinstance(stmt, ast.For) and not prefix:
                out.append(("for " + ast.unparse(stmt.target), stmt, stmt.iter))
            elif isinstance(stmt, ast.ClassDef):
                visit(stmt.body, prefix + stmt.name + ".")
            elif isinstance(stmt, ast.If) and not prefix:  # e.g. a table under ``if sys.version...``
                visit(stmt.body + stmt.orelse, prefix)

    visit(tree.body, "")
    return out


def _callee(call: ast.Call) -> str:
    return ast.unparse(call.func)


def _command_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The command a function is registered as by an ``@<app>.command(...)`` decorator, if it is."""
    for dec in fn.decorator_list:
        call = dec if isinstance(dec, ast.Call) else None
        func = call.func if call is not None else dec
        if isinstance(func, ast.Attribute) and func.attr == "command":
            first = _strings(call.args[0]) if call is not None and call.args else []
            return first[0] if first else fn.name.replace("_", "-")
    return None


def name_tables(trees: dict[str, ast.Module]) -> list[NameTable]:
    """The name tables (see the module docstring), in file order; the commands' table last."""
    out: list[NameTable] = []
    for f, tree in trees.items():
        for name, stmt, expr in _table_statements(tree):
            for lit in _outer_literals(expr):
                names = _literal_names(lit)
                if len(experiments_named(names)) >= 2:
                    out.append(NameTable(f, name, stmt.lineno, sorted(names)))
        calls: dict[str, NameTable] = {}
        for stmt in tree.body:
            call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
            first = _strings(call.args[0]) if call is not None and call.args else []
            if first and first[0] in EXPERIMENT_NAMES:
                table = calls.setdefault(_callee(call), NameTable(f, _callee(call) + "(...) calls", stmt.lineno))
                table.names.append(first[0])
        out += [t for t in calls.values() if len(experiments_named(t.names)) >= 2]
    commands = NameTable("", "hand-written commands", 0)
    files = []
    for f, tree in trees.items():
        for _, fn in _functions(tree):
            cmd = _command_name(fn)
            if cmd is not None and cmd in EXPERIMENT_NAMES:
                files.append(f)
                commands.names.append(cmd)
    if commands.names:
        commands.file = files[0] if len(set(files)) == 1 else posixpath.commonpath(files) + "/*"
        commands.names.sort()
        out.append(commands)
    return out


def _is_option_call(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Option"


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] == "dataclass"
               for d in cls.decorator_list)


def _is_options_class(cls: ast.ClassDef) -> bool:
    return any(n.endswith("Options") for n in [cls.name, *(ast.unparse(b).split(".")[-1] for b in cls.bases)])


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[ast.arg, ast.AST | None]]:
    """Each parameter with its default (None where it has none)."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.AST | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    return list(zip(positional, defaults, strict=True)) + list(zip(a.kwonlyargs, a.kw_defaults, strict=True))


def _owners(file: str, qualname: str) -> tuple[str, ...]:
    """The experiments whose options a place declares (see the module docstring)."""
    for text in (qualname.lower(), file.lower()):
        found = tuple(e for e, words in OPTION_OWNERS.items() if any(w in text for w in words))
        if found:
            return found
    return tuple(OPTION_OWNERS)


def option_places(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each option of :data:`OPTIONS` (``experiment.name``) -> the places (``file:qualname``) declaring it."""
    places: dict[str, list[str]] = {f"{e}.{o}": [] for e, opts in OPTIONS.items() for o in sorted(opts)}

    def declare(f: str, qualname: str, names: list[str]) -> None:
        for e in _owners(f, qualname):
            for o in names:
                if o in OPTIONS[e]:
                    places[f"{e}.{o}"].append(f"{f}:{qualname}")

    for f, tree in trees.items():
        in_area = f.startswith(PARAMETER_AREAS)
        for name, fn in _functions(tree):
            params = [(arg.arg, default) for arg, default in _parameters(fn) if arg.arg in OPTION_NAMES]
            repeats_set = in_area and len(params) >= 2
            declare(f, name, [o for o, default in params if repeats_set or _is_option_call(default)])
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_dataclass(node) and (in_area or _is_options_class(node)):
                declare(f, node.name, [stmt.target.id for stmt in node.body if isinstance(stmt, ast.AnnAssign)
                                       and isinstance(stmt.target, ast.Name) and stmt.target.id in OPTION_NAMES])
    return places


def _compares_kind(node: ast.AST) -> bool:
    """``kind == "sweep"``, ``d.get("kind") in ("rank", "edges")`` and the like."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    named = False
    for side in sides:
        items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        named = named or any(s in EXPERIMENT_NAMES for item in items for s in _strings(item))
    return named and any("kind" in ast.unparse(side) for side in sides)


def result_readers(trees: dict[str, ast.Module]) -> tuple[list[Reader], list[Reader]]:
    """(per-kind readers, generic readers) of ``results.py`` and ``report/`` (see the module docstring)."""
    per_kind: list[Reader] = []
    generic: list[Reader] = []
    for f, tree in trees.items():
        if not f.startswith(READER_AREAS):
            continue
        for unit in tree.body:
            if not isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            strings = {s for node in ast.walk(unit) for s in _strings(node)}
            files = sorted(strings & KIND_FILES.keys())
            why = []
            if files:
                why.append("names " + ", ".join(files))
            if any(_compares_kind(node) for node in ast.walk(unit)):
                why.append("compares with a kind's name")
            if isinstance(unit, ast.ClassDef) and any(
                    isinstance(s, ast.FunctionDef) and s.name == "headline" for s in unit.body):
                why.append("a class with headline()")
            if why:
                per_kind.append(Reader(f, unit.name, unit.lineno, "; ".join(why)))
            elif GENERIC_FILE in strings:
                generic.append(Reader(f, unit.name, unit.lineno, "names result.json"))
    return per_kind, generic


def survey(root: Path) -> dict:
    """Every count of the module docstring for the checkout at ``root``, as one JSON-ready dict."""
    pkg = Path(root) / "src" / "ganda"
    if not pkg.is_dir():
        raise SystemExit(f"surface.py: no src/ganda under {root}")
    trees = package_files(pkg)
    longs = long_functions(trees)
    tables = name_tables(trees)
    places = option_places(trees)
    per_kind, generic = result_readers(trees)
    distinct = sorted({p for ps in places.values() for p in ps})
    worst = max(places.items(), key=lambda kv: (len(set(kv[1])), kv[0]), default=("", []))
    return {
        "lines": count_lines(pkg),
        "commands_lines": count_lines(pkg, "commands"),
        "long_functions": len(longs),
        "name_tables": len(tables),
        "option_places": len(set(worst[1])),
        "option_places_option": worst[0],
        "option_declaring_places": len(distinct),
        "result_readers": len(per_kind) + (1 if generic else 0),
        "detail": {
            "parts": line_parts(pkg, trees),
            "long_functions": [asdict(x) for x in longs],
            "name_tables": [asdict(x) for x in tables],
            "option_places": {k: sorted(set(v)) for k, v in places.items()},
            "per_kind_readers": [asdict(x) for x in per_kind],
            "generic_readers": [asdict(x) for x in generic],
        },
    }


def table(s: dict) -> str:
    """The survey as a plain-text table, then the lists behind each count."""
    d = s["detail"]
    rows = [
        ("lines in src/ganda", s["lines"]),
        ("lines in src/ganda/commands", s["commands_lines"]),
        (f"functions over {LONG} lines", s["long_functions"]),
        ("name tables mapping an experiment to behaviour", s["name_tables"]),
        ("places an option of rank or edges is declared" + (f" ({s['option_places_option']})"
                                                             if s["option_places"] else ""), s["option_places"]),
        ("  places declaring any of their options", s["option_declaring_places"]),
        ("result readers (per-kind + 1 if a generic one)", s["result_readers"]),
    ]
    width = max(len(r[0]) for r in rows)
    out = [f"{name:<{width}}  {value:>6}" for name, value in rows]
    out += ["", "lines by part (lines, docstrings, blank, the rest):"]
    out += [f"  {name:<{width - 2}}  {p['lines']:>6} {p['docstrings']:>6} {p['blank']:>6} "
            f"{p['lines'] - p['docstrings'] - p['blank']:>6}" for name, p in d["parts"].items()]
    out += ["", f"functions over {LONG} lines:"]
    out += [f"  {x['lines']:4d}  {x['file']}:{x['name']} (line {x['line']})" for x in d["long_functions"]]
    out += ["", "name tables:"]
    out += [f"  {x['file']}:{x['name']}" + (f" (line {x['line']})" if x["line"] else "") + f": {', '.join(x['names'])}"
            for x in d["name_tables"]]
    out += ["", "rank/edges options declared in more than one place:"]
    out += [f"  {opt}: {len(ps)}" for opt, ps in d["option_places"].items() if len(ps) > 1]
    out += ["", "places declaring rank/edges options:"]
    by_place: dict[str, list[str]] = {}
    for opt, ps in d["option_places"].items():
        for p in ps:
            by_place.setdefault(p, []).append(opt)
    out += [f"  {p}: {', '.join(sorted(opts))}" for p, opts in sorted(by_place.items())]
    out += ["", "result readers:"]
    out += [f"  {x['file']}:{x['name']} (line {x['line']}): {x['why']}" for x in d["per_kind_readers"]]
    out += [f"  {x['file']}:{x['name']} (line {x['line']}): generic, {x['why']}" for x in d["generic_readers"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout to count (default: this script's)")
    args = ap.parse_args(argv)
    s = survey(args.root)
    print(json.dumps(s, indent=1) if args.json else table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
