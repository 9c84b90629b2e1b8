"""The ``ganda`` command line: a thin typer layer over the library (parse, call, print).

Every registered experiment that runs on one task is a command built from its declaration
(``ganda NAME``: :mod:`ganda.commands.analyses`). The other commands (``info``, ``plan``, ``grid``,
``report``, ...) live in ``ganda/commands/<area>.py``; each module defines ``register(app)`` and
is discovered automatically. Plugins add theirs through ``register_cli(app)``
(:mod:`ganda.registry`), e.g. the lab's ``train`` and ``lab``.
"""

from __future__ import annotations

import errno
import importlib
import os
import pkgutil
import signal
import sys
import time
from typing import Any

import typer

from . import _as_command, _interrupted_at_startup, commands, progress, registry, runio
from .commands.analyses import AnalysisGroup
from .errors import GandaError

# the command that runs and when it started, for its final summary line
_run: dict[str, object] = {}

app = typer.Typer(
    cls=AnalysisGroup,
    add_completion=False,
    no_args_is_help=True,
    help="ganda: find, measure, disable and transplant Gather-and-Aggregate heads.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: a flag shows as a flag (rich panels label it <bool>), no rich import
)


def _finished(*_: object, **__: object) -> None:
    """Called after a command's body returns (not after ``--help``): it gets its summary line."""
    _run["done"] = True


@app.callback(result_callback=_finished)
def _root(
    ctx: typer.Context,
    dtype: str | None = typer.Option(None, "--dtype", help="precision of every model the command loads: float32, "
                                     "bfloat16, float16 (GANDA_DTYPE; default bf16 on CUDA, fp32 on CPU)"),
    device_map: str | None = typer.Option(None, "--device-map", help="spread models over GPUs, CPU and disk: auto, "
                                          "a JSON object or a .json file of module -> device (GANDA_DEVICE_MAP)"),
    offload_folder: str | None = typer.Option(None, "--offload-folder", help="where disk-offloaded weights go "
                                              "(GANDA_OFFLOAD_FOLDER)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars or notes on stderr, only the final "
                               "summary line (every command also takes --quiet/-q)"),
    threads: str | None = typer.Option(None, "--threads", help="torch CPU threads (GANDA_THREADS; default one per "
                                       "core, and waiting threads sleep rather than spin beside other jobs)"),
) -> None:
    """ganda: find, measure, disable and transplant Gather-and-Aggregate heads.

    Every command ends with one summary line on stderr (what ran, how long, where its files are)."""
    _run.update(command=ctx.invoked_subcommand, start=time.perf_counter())
    progress.log_every()  # a bad GANDA_PROGRESS_EVERY is refused before any work, as GANDA_THREADS is
    if quiet:
        progress.set_quiet(True)
    if (dtype, device_map, offload_folder) != (None, None, None):
        from .models import placement  # torch: loaded only when a placement option is given

        placement.apply_command_options(dtype, device_map, offload_folder)
    if threads is not None or os.environ.get("GANDA_THREADS", "").strip():
        from . import device  # torch: loaded only when a thread count is given

        device.set_threads(threads)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(app)
    registry.register_plugin_commands(app)


_register_commands()


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


def _interrupted(kept: str | None = None) -> int:
    """The one line and exit status of a stopped command: 130 after Ctrl-C, 143 after SIGTERM."""
    note = runio.take_interrupt_note() or kept or runio.interrupt_summary()
    term = _run.get("signal") == signal.SIGTERM
    print(f"ganda: {'terminated' if term else 'interrupted'}" + (f"; {note}" if note else ""), file=sys.stderr)
    return 143 if term else 130


def _holds_back(code: Any) -> bool:
    """Code in which a KeyboardInterrupt goes wrong: an import (a module's code runs under importlib's
    frames) or a finalizer (``__del__``, whose exceptions Python prints and drops)."""
    return code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib._bootstrap")


def _outermost_held(frame: Any) -> Any:
    """The outermost import or finalizer frame under ``frame`` (None when there is none)."""
    held = None
    while frame is not None:
        if _holds_back(frame.f_code):
            held = frame
        frame = frame.f_back
    return held


def _interrupt_when_left(frame: Any, event: str, _arg: Any, _run: dict = _run, _kill: Any = os.kill,
                         _pid: Any = os.getpid, _profile: Any = sys.setprofile, _sig: int = signal.SIGINT) -> None:
    """A profile function: at the first event after the held-back frame returned, Ctrl-C again
    (its names are bound here: it may run as the interpreter shuts down)."""
    if _run.get("held_in") is None:
        _profile(None)
        _kill(_pid(), _run.get("signal", _sig))  # SIGTERM again after a SIGTERM: SIGINT may be ignored
    elif event == "return" and frame is _run["held_in"]:
        _run["held_in"] = None


def _ctrl_c(signum: int, frame: Any) -> None:
    """Python's Ctrl-C, held back while a module is imported or an object finalized: raised in an
    import, a KeyboardInterrupt aborts the process from torch's C++ start-up (``terminate called ...
    KeyboardInterrupt``) or leaves a half-imported module that later fails as 'a circular import';
    raised in ``__del__`` it is printed and lost. It is raised once the outermost such frame has
    returned. An error that follows an interrupt a library swallowed is reported as the interrupt."""
    _run["interrupted"] = True
    held = _outermost_held(frame)
    if held is not None:
        _run["held_in"] = held
        sys.setprofile(_interrupt_when_left)
        return
    signal.default_int_handler(signum, frame)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (a scheduler's time limit, ``kill``) stops a command as Ctrl-C does: what the
    journals hold stays, the run directory is released, and the last line says how to resume."""
    _run["signal"] = signal.SIGTERM
    _ctrl_c(signal.SIGINT, frame)


def _summary() -> None:
    """The last line of every command on stderr: what ran, how long it took, where its files are."""
    if not _run.get("done"):
        return
    seconds = time.perf_counter() - float(_run["start"])  # type: ignore[arg-type]
    dirs = runio.claimed_dirs()
    where = f"; files in {', '.join(str(d) for d in dirs)}" if dirs else ""
    print(f"ganda {_run['command']}: done in {seconds:.1f} s{where}", file=sys.stderr, flush=True)


def _click_error(exc: Exception) -> int | None:
    """The exit status of an error from typer's click layer, printed in one line (None: not one)."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # plain ``ganda``: the help is the answer
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = exc.format_message().replace("Value error, ", "")  # pydantic's prefix to a parser's ValueError
        print(f"ganda: error: {message}{hint}", file=sys.stderr)
        return int(exc.exit_code)
    if type(exc).__name__ == "Abort":
        return 1
    return None


def _restore() -> None:
    """What a command set for itself goes back: claims, quiet, placement, threads, a held Ctrl-C."""
    if sys.getprofile() is _interrupt_when_left:  # a Ctrl-C still held back when the command ended
        sys.setprofile(None)
    runio.release_claims()
    progress.set_quiet(False)
    if (placement := sys.modules.get("ganda.models.placement")) is not None:
        placement.restore_command_options()
    if (device := sys.modules.get("ganda.device")) is not None:
        device.restore_threads()


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one line and exit 2, never a traceback; Ctrl-C exits 130
    (SIGTERM 143).

    typer turns a KeyboardInterrupt inside a command into exit code 130 and returns it (with
    ``standalone_mode=False``), so the return value is the exit status."""
    runio.set_interrupt_note(None)
    _run.clear()
    runio.set_argv(argv)
    rc: object = None
    if "torch" not in sys.modules:  # read once, when torch loads OpenMP (BENCHMARKS.md, threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted_at_startup:  # from here on, Ctrl-C is caught below
            signal.signal(signal.SIGINT, _ctrl_c)
        # SIGTERM too where SIGINT is ignored, as it is for a job started by ``nohup ganda ... &``
        if _as_command() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate)
        rc = app(args=argv, standalone_mode=False, prog_name="ganda")
        if rc in (None, 0):
            _summary()
    except GandaError as exc:
        runio.discard_claims()  # a refused run leaves nothing it created (docs/reliability.md)
        if _run.get("interrupted"):  # the error of an interrupt a library swallowed
            return _interrupted()
        print(f"ganda: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:  # typer/click exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return _interrupted() if code == 130 else code
    except OSError as exc:  # a full disk, a read-only file system: one line, not a traceback
        if _run.get("interrupted"):
            return _interrupted()
        if exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"ganda: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except Exception as exc:  # usage errors from typer's click layer: one line, like every error
        if _run.get("interrupted"):
            return _interrupted()
        if (code := _click_error(exc)) is None:
            raise
        return code
    finally:
        kept = runio.interrupt_summary() if rc == 130 else None
        _restore()
    if rc == 130:
        return _interrupted(kept)
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
