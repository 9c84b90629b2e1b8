"""The suite's own shape (tests/README.md): every test in one tier, the fast tier kept fast by
construction.

The fast tier is what a bare ``pytest`` runs. Its budget holds because a fast test cannot start a
subprocess or load a real model (``conftest._fast_tier_guard`` fails it with one line naming the
marker it needs), and because a test whose own body visibly does either carries its marker (the static
check below, which also catches a test the guard would only meet on a rare path).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from conftest import COLLECTED_FILES, TIER_COUNTS, TIERS

HERE = Path(__file__).parent
#: fixtures that load a real model, and calls in a test's body that start a process
REAL_MODEL_FIXTURES = {"smollm2", "smollm2_wheel", "gemma", "gemma_wheels"}
STARTS_A_PROCESS = ("subprocess.", "sys.executable", "Popen(")


def _tier_marks(node: ast.AST, src: str) -> set[str]:
    decorators = [ast.get_source_segment(src, d) or "" for d in getattr(node, "decorator_list", [])]
    return {t for t in TIERS for d in decorators if f"mark.{t}" in d}


def _module_tiers(tree: ast.Module, src: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            seg = ast.get_source_segment(src, node.value) or ""
            return {t for t in TIERS if f"mark.{t}" in seg}
    return set()


def test_a_fast_test_cannot_start_a_subprocess():
    with pytest.raises(pytest.fail.Exception, match=r"started a subprocess: mark it @pytest.mark.integration"):
        subprocess.run(["true"], check=False)


def test_a_fast_test_cannot_load_a_real_model():
    import ganda

    with pytest.raises(pytest.fail.Exception, match=r"loaded the real model smollm2-135m: mark it @pytest.mark.slow"):
        ganda.load_model("smollm2-135m")
    with pytest.raises(pytest.fail.Exception, match=r"real model gemma3-270m: mark it @pytest.mark.slow"):
        ganda.load_model("gemma3-270m")


def test_the_tier_markers_are_registered(pytestconfig):
    registered = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    assert set(TIERS) <= registered


def test_every_test_that_visibly_needs_a_tier_carries_it():
    """A test function that asks for a real model's fixture or starts a process in its own body is in
    the tier that pays for it (its own marker or its module's ``pytestmark``)."""
    wrong = []
    for path in sorted(HERE.glob("test_*.py")):
        if path.name == Path(__file__).name:  # the guard's own tests start a process on purpose
            continue
        src = path.read_text()
        lines = src.splitlines()
        tree = ast.parse(src)
        module = _module_tiers(tree, src)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            body = "\n".join(lines[node.lineno - 1:node.end_lineno])
            tiers = module | _tier_marks(node, src)
            assert len(tiers) <= 1, f"{path.name}::{node.name} is in {sorted(tiers)}"
            args = {a.arg for a in node.args.args}
            if args & REAL_MODEL_FIXTURES and not tiers:
                wrong.append(f"{path.name}::{node.name} loads a real model: mark it slow")
            if any(call in body for call in STARTS_A_PROCESS) and not tiers:
                wrong.append(f"{path.name}::{node.name} starts a process: mark it integration")
    assert not wrong, wrong


def test_the_fast_tier_holds_most_of_the_suite(request):
    """At least 60% of the collected tests run in the fast tier (the count is taken before ``-m``
    deselects, so it is the whole suite's share whichever tier this run selects)."""
    counts = request.config.stash[TIER_COUNTS]
    files = request.config.stash[COLLECTED_FILES]
    if files < len(list(HERE.glob("test_*.py"))):
        pytest.skip("the share is a property of the whole suite; this run collected part of it")
    total = sum(counts.values())
    assert counts["fast"] / total >= 0.60, counts

