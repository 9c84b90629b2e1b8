"""``--threads`` / ``GANDA_THREADS`` set torch's intra-op threads for a command, and the command
line starts torch with waiting OpenMP threads asleep (``OMP_WAIT_POLICY=PASSIVE``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ganda.models
from ganda.cli import main
from ganda.errors import GandaError


@pytest.fixture
def seen(monkeypatch):
    """The torch thread count a command runs with (``info`` stops at loading its model)."""
    out: list[int] = []

    def load_model(*_a, **_k):
        out.append(torch.get_num_threads())
        raise GandaError("stopped by the test")

    monkeypatch.setattr(ganda.models, "load_model", load_model)
    monkeypatch.delenv("GANDA_THREADS", raising=False)
    return out


@pytest.mark.parametrize("n", [1, 3])
def test_threads_option_sets_torch_threads_for_the_command(seen, capsys, n):
    before = torch.get_num_threads()
    assert main(["--threads", str(n), "info", "some-model"]) == 2
    assert seen == [n]
    assert torch.get_num_threads() == before  # restored when the command ends
    assert "stopped by the test" in capsys.readouterr().err


def test_threads_from_environment_and_default(seen, monkeypatch):
    before = torch.get_num_threads()
    main(["info", "some-model"])
    monkeypatch.setenv("GANDA_THREADS", "1")
    main(["info", "some-model"])
    main(["--threads", "2", "info", "some-model"])  # the option wins over the environment
    assert seen == [before, 1, 2]


@pytest.mark.parametrize(("argv", "env", "what"), [
    (["--threads", "0"], None, "--threads='0'"),
    (["--threads", "x"], None, "--threads='x'"),
    (["--threads", "-2"], None, "--threads='-2'"),
    ([], "two", "GANDA_THREADS='two'"),
])
def test_bad_thread_counts_exit_2_with_one_line(seen, monkeypatch, capsys, argv, env, what):
    if env is not None:
        monkeypatch.setenv("GANDA_THREADS", env)
    assert main([*argv, "info", "some-model"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err
    assert err.startswith("ganda: error: ") and what in err and "number of threads" in err
    assert seen == []  # refused before any work


def _policy_after_cli(env: dict[str, str]) -> str:
    """OMP_WAIT_POLICY as a command found it (torch is first loaded by the command itself)."""
    code = ("import os; from ganda.cli import main; main(['--threads', '1', 'info', '/nonexistent']); "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


@pytest.mark.integration
def test_command_line_starts_torch_with_passive_waits():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GANDA_THREADS")}
    assert _policy_after_cli(env) == "PASSIVE"
    assert _policy_after_cli({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"  # a user's choice stays


def _policy_after_import(env: dict[str, str], first: str = "") -> str:
    """OMP_WAIT_POLICY as the library leaves it (``first``: a module imported before ganda)."""
    code = f"import os; {first}import ganda, torch; torch.ones(4) @ torch.ones(4); print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


@pytest.mark.integration
def test_the_library_starts_torch_with_passive_waits_too():
    """``import ganda`` (the README snippet, the notebook) sets the policy the command line sets; a
    user's choice stays, and torch imported first has read its environment already."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GANDA_THREADS")}
    assert _policy_after_import(env) == "PASSIVE"
    assert _policy_after_import({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
    assert _policy_after_import(env, first="import torch; ") == "None"
