"""``scripts/surface.py``'s counts, on a small package written under tmp_path (not the real one,
whose numbers change as the code does): each rule of its docstring is checked on a case it must
count and a near miss it must not."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "surface.py"


@pytest.fixture(scope="module")
def surface():
    spec = importlib.util.spec_from_file_location("surface_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _body(n: int) -> str:
    """A function body of ``n`` lines."""
    return "\n".join(f"    x{i} = {i}" for i in range(n))


FILES = {
    # 3 lines; an experiment table the registry loops over (one table), a tuple of one kind's files (none)
    "experiments/__init__.py": '''
        for _name, _target in {"sweep": "a:Sweep", "rank": "a:Rank", "attribution": "a:Rank"}.items():
            register(_name, _target)
        OWN_FILES = ("results.jsonl", "progress.jsonl", "cumulative.json")
    ''',
    # an options dataclass (declares 2 options), a plain function repeating two of them (a place),
    # one that shares a single name by chance (not a place)
    "experiments/builtin.py": '''
        from dataclasses import dataclass

        @dataclass
        class RankOptions(Options):
            verify_top: int = 10
            audit: int = 0
            seed: int = 0

        def rank_phases(p, verify_top, audit=0):
            return p

        def control_heads(heads, screen=None):
            return heads
    ''',
    # a result record outside the areas: its ``method`` field is no option; register calls for two
    # experiments (one table) and one for a single kind (none)
    "library.py": '''
        from dataclasses import dataclass

        @dataclass
        class RankResult:
            method: str = "atp"

        register_result("kv_curve", "x")
        register_result("roles", "y")
        register_plugin("demo", "z")
    ''',
    # ``ganda plan``'s flags: a place naming neither experiment declares the option for both
    "commands/plan.py": '''
        import typer

        def register(app):
            @app.command("plan")
            def plan_cmd(verify_top: int = typer.Option(10), senders_file: str = typer.Option("")):
                pass
    ''',
    # two hand-written experiment commands (one table), one that is no experiment; a typer option
    "commands/rank.py": '''
        import typer

        def register(app):
            @app.command(short_help="rank")
            def rank(verify_top: int = typer.Option(10, "--verify-top"), limit: int = typer.Option(1)):
                pass

            @app.command("kv-curve")
            def kv():
                pass

            @app.command()
            def info():
                pass
    ''',
    # readers: two per-kind functions, a per-kind class, one generic function, one that reads nothing
    "results.py": '''
        TITLES = {"sweep": "Every head ablated", "circuit_edges": "The circuit"}

        def _sweep(run):
            return (run / "results.jsonl").read_text()

        def _result(run, d):
            if d.get("kind") == "sharpness":
                return d["differences"]
            return {k: v for k, v in d.items() if k != "heads"}

        def _generic(run):
            return (run / "result.json").read_text()

        class RankRun:
            def headline(self):
                return ""

        def _helper(x):
            return x
    ''',
}


def _tree(root: Path) -> Path:
    pkg = root / "src" / "ganda"
    for name, text in FILES.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(text).lstrip("\n"))
    (pkg / "long.py").write_text(f"def long_one():\n{_body(60)}\n\n\ndef just_60():\n{_body(59)}\n\n\n"
                                 f"class K:\n    @property\n    def method(self):\n    {_body(61).replace(chr(10), chr(10) + '    ')}\n")
    return root


def test_lines_and_long_functions(surface, tmp_path):
    root = _tree(tmp_path)
    pkg = root / "src" / "ganda"
    expected = sum(len(p.read_text().splitlines()) for p in pkg.rglob("*.py"))
    s = surface.survey(root)
    assert s["lines"] == expected
    assert s["commands_lines"] == sum(len((pkg / "commands" / f).read_text().splitlines())
                                      for f in ("plan.py", "rank.py")) == 6 + 14
    longs = {(x["file"], x["name"]): x["lines"] for x in s["detail"]["long_functions"]}
    # 61 lines from def to end: counted; exactly 60: not; a method under a decorator: its def line on
    assert longs == {("long.py", "long_one"): 61, ("long.py", "K.method"): 62}
    assert s["long_functions"] == 2


def test_lines_by_part(surface, tmp_path):
    """Each top-level folder or module: its lines, docstring lines (module, class and function,
    whole spans) and blank lines, largest first, and the parts add up to the package's lines."""
    root = _tree(tmp_path)
    pkg = root / "src" / "ganda"
    (pkg / "documented.py").write_text('"""Module,\non two lines."""\n\n\nclass A:\n    """One."""\n\n'
                                       '    def f(self):\n        """Two\n        lines."""\n        return "not a docstring"\n')
    s = surface.survey(root)
    parts = s["detail"]["parts"]
    assert parts["documented.py"] == {"lines": 11, "docstrings": 5, "blank": 3}
    assert parts["commands/"]["lines"] == 20 and parts["commands/"]["docstrings"] == 0
    assert parts["long.py"]["blank"] == 4
    assert sum(p["lines"] for p in parts.values()) == s["lines"]
    assert list(parts)[0] == "long.py"  # the largest part first
    out = surface.table(s)
    assert "lines by part" in out and "documented.py" in out.split("lines by part")[1]


def test_name_tables(surface, tmp_path):
    s = surface.survey(_tree(tmp_path))
    tables = {(t["file"], t["name"]): t["names"] for t in s["detail"]["name_tables"]}
    assert tables == {
        ("experiments/__init__.py", "for (_name, _target)"): ["attribution", "rank", "sweep"],
        ("library.py", "register_result(...) calls"): ["kv_curve", "roles"],
        ("results.py", "TITLES"): ["circuit_edges", "sweep"],
        ("commands/rank.py", "hand-written commands"): ["kv-curve", "rank"],
    }
    assert s["name_tables"] == 4


def test_option_places(surface, tmp_path):
    s = surface.survey(_tree(tmp_path))
    places = {k: v for k, v in s["detail"]["option_places"].items() if v}
    # rank's own: the typer command ``rank``, RankOptions, rank_phases' repeated pair; edges' own: none,
    # but ``plan_cmd`` (naming neither) declares verify_top for both
    assert places == {
        "rank.verify_top": ["commands/plan.py:register.plan_cmd", "commands/rank.py:register.rank",
                            "experiments/builtin.py:RankOptions", "experiments/builtin.py:rank_phases"],
        "rank.audit": ["experiments/builtin.py:RankOptions", "experiments/builtin.py:rank_phases"],
        "edges.verify_top": ["commands/plan.py:register.plan_cmd"],
    }
    assert (s["option_places"], s["option_places_option"], s["option_declaring_places"]) == (4, "rank.verify_top", 4)


def test_result_readers(surface, tmp_path):
    s = surface.survey(_tree(tmp_path))
    per_kind = {r["name"] for r in s["detail"]["per_kind_readers"]}
    assert per_kind == {"_sweep", "_result", "RankRun"}
    assert [r["name"] for r in s["detail"]["generic_readers"]] == ["_generic"]
    assert s["result_readers"] == 4


def test_main_prints_table_and_json(surface, tmp_path, capsys):
    root = _tree(tmp_path)
    assert surface.main(["--root", str(root), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["long_functions"], d["name_tables"], d["option_places"], d["result_readers"]) == (2, 4, 4, 4)
    assert surface.main(["--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "functions over 60 lines" in out and "long.py:long_one" in out


def test_runs_on_this_checkout(surface):
    """The rules parse the real package (its numbers change with the code and are not checked here)."""
    s = surface.survey(SCRIPT.parents[1])
    assert s["lines"] > s["commands_lines"] > 0
    assert {"long_functions", "name_tables", "option_places", "result_readers"} <= s.keys()
