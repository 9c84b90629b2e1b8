"""Every code block of README.md is checked.

* ``python`` blocks run in a fresh interpreter in an empty directory (on the real SmolLM2); each
  ``print(...)`` whose line ends in a ``# <number>`` comment must print that number (the lines that
  print one number, in order), so the README states what the code prints.
* ``bash`` blocks: every ``ganda`` command line is parsed by the real command line (options, their
  types and arguments, global options such as ``--dtype`` included) without running it: most take
  minutes to hours (a demo, a 59-minute lab rebuild, an 8B model from the hub), which a test suite
  cannot spend. The ones that answer from shipped files in a second run in full
  (:data:`RUN_FULLY`), and their stated numbers are checked. ``bash scripts/*.sh`` lines must name
  an existing script that ``bash -n`` parses; install lines (``pip install``) are not commands of
  ganda and are left to the install scripts' own test runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
#: ganda commands that read only shipped files and finish in seconds: run, and their output must
#: hold what the README's comment on that line states.
RUN_FULLY = ("ganda info meta-llama/Llama-3.1-8B --meta",)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(README.read_text()) if kind == lang]


def command_lines() -> list[str]:
    """Every command of the bash blocks, continuation lines joined, comments kept."""
    out = []
    for body in blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip():
                out.append(line.strip())
    return out


def test_readme_has_the_blocks_this_test_checks():
    assert len(blocks("python")) >= 1
    assert sum(line.startswith(("ganda", "HF_HUB_OFFLINE")) for line in command_lines()) >= 10


def _words(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # environment assignments
        words.pop(0)
    if words and words[-1] == "...":  # "the rest as above": the command up to here must parse
        words.pop()
    return words


@pytest.mark.parametrize("line", [x for x in command_lines() if _words(x)[:1] == ["ganda"]])
def test_ganda_command_parses(line):
    """The command line accepts the command: every option exists and takes its value's type."""
    import typer.main

    from ganda.cli import app
    from ganda.registry import register_plugin_commands

    register_plugin_commands(app)
    cli = typer.main.get_command(app)
    args = _words(line)[1:]
    with cli.make_context("ganda", list(args), resilient_parsing=False) as ctx:
        name, cmd, rest = cli.resolve_command(ctx, [*getattr(ctx, "_protected_args", []), *ctx.args])
        assert cmd is not None, line
        cmd.make_context(name, rest, parent=ctx)


@pytest.mark.integration
@pytest.mark.parametrize("line", [x for x in command_lines() if _words(x)[:1] == ["bash"]])
def test_script_lines_name_scripts_that_parse(line):
    script = ROOT / _words(line)[1]
    assert script.is_file(), line
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_every_bash_line_is_checked():
    """No command in a bash block slips past both checks above."""
    for line in command_lines():
        assert _words(line)[:1] in (["ganda"], ["bash"]), line


@pytest.mark.parametrize("line", RUN_FULLY)
def test_quick_commands_print_what_the_readme_states(line, capsys):
    from ganda.cli import main

    stated = next(x for x in command_lines() if x.startswith(line))
    claims = stated.split("#", 1)[1].strip().split(", ")  # "8,030,261,248 parameters, 32 layers, ..."
    assert main(_words(line)[1:]) == 0
    out = capsys.readouterr().out
    for claim in claims:
        number = claim.split()[0]
        assert number in out, (claim, out)


def _stated_prints(code: str) -> list[float]:
    """The numbers the README says the block prints: ``print(...)  # 0.725`` lines, in order."""
    return [float(m.group(1)) for m in re.finditer(r"print\(.*#\s*([0-9.]+)", code)]


@pytest.mark.usefixtures("smollm2_wheel")
@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_and_prints_what_it_states(index, tmp_path):
    code = blocks("python")[index]
    stated = _stated_prints(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = [float(x) for x in proc.stdout.split("\n") if re.fullmatch(r"[0-9.]+", x.strip())]
    assert printed == pytest.approx(stated, abs=1e-9), (printed, stated, proc.stdout)
