"""ganda: find, measure, disable and transplant Gather-and-Aggregate heads.

Data flows one way: ``load_model`` -> choose heads (``heads``) -> intervene
(``interventions``) -> evaluate (``tasks`` + ``scoring``) -> report (``report``).

The built-in model families, tasks and result kinds register when their packages load
(:mod:`ganda.models`, :mod:`ganda.tasks`, :mod:`ganda.experiments`); plugins add theirs on the
first lookup that misses.
"""

import importlib
import os
import signal
import sys
from typing import Any

from .errors import GandaError

# Waiting OpenMP threads sleep instead of spinning, so torch's one-thread-per-core default does not
# collapse beside other jobs (BENCHMARKS.md, threads): set for the library as for the command line,
# unless the user chose a policy. OpenMP reads it once, when torch loads it, so it takes effect when
# ganda is imported before torch.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _interrupted_at_startup(_signum: int, _frame: Any) -> None:
    """Ctrl-C before the command line can catch it: one line and exit 130, as any interrupt."""
    try:
        sys.stderr.write("ganda: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


def _as_command() -> bool:
    """Whether this process is the ``ganda`` command (the script or ``python -m ganda``): only then
    does ganda set signal handlers; a program that imports it as a library keeps its own."""
    argv = list(getattr(sys, "orig_argv", None) or [])[1:]
    while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c", "-"):  # interpreter options
        argv = argv[2:] if argv[0] in ("-X", "-W", "--check-hash-based-pycs") else argv[1:]
    return argv[:2] == ["-m", "ganda"] or (bool(argv) and os.path.basename(argv[0]) == "ganda")


def _guard_startup() -> None:
    """Run as the ``ganda`` command, a Ctrl-C during start-up (imports take most of a second) would
    print a KeyboardInterrupt traceback from whichever import it hit: until :func:`ganda.cli.main`
    restores Python's handler, it exits 130 in one line."""
    if _as_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_at_startup)


_guard_startup()

# The public names load on first use: ``import ganda`` (and ``ganda --help``) does not wait for
# torch. A module that looks a task or result kind up imports the package that registers it.
_LAZY = {
    "HeadId": "heads",
    "AblateHeads": "interventions",
    "KeepHeads": "interventions",
    "KeepLayers": "interventions",
    "RemoveLayers": "interventions",
    "mask_last_row": "interventions",
    "truncate": "interventions",
    "ModelAdapter": "models",
    "from_model": "models",
    "load_model": "models",
}

__version__ = "0.1.0"

__all__ = [
    "AblateHeads",
    "GandaError",
    "HeadId",
    "KeepHeads",
    "KeepLayers",
    "ModelAdapter",
    "RemoveLayers",
    "from_model",
    "load_model",
    "mask_last_row",
    "truncate",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``ganda.load_model``, ``ganda.heads``, ...: the module that holds the name, imported on use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif not name.startswith("_"):
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
