"""The ``ganda`` command line: a thin typer layer over the library (parse, call, print).

Commands live in ``ganda/commands/<area>.py``; each module defines ``register(app)`` and is
discovered automatically, so areas can be added without editing this file. Plugins add theirs
through ``register_cli(app)`` (:mod:`ganda.registry`), e.g. the lab's ``train`` and ``lab``.
"""

from __future__ import annotations

import errno
import importlib
import pkgutil
import sys

import typer

from . import commands, registry, runio
from .errors import GandaError
from .models import placement

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ganda: find, measure, disable and transplant Gather-and-Aggregate heads.",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    dtype: str | None = typer.Option(None, "--dtype", help="precision of every model the command loads: float32, "
                                     "bfloat16, float16 (GANDA_DTYPE; default bf16 on CUDA, fp32 on CPU)"),
    device_map: str | None = typer.Option(None, "--device-map", help="spread models over GPUs, CPU and disk: auto, "
                                          "a JSON object or a .json file of module -> device (GANDA_DEVICE_MAP)"),
    offload_folder: str | None = typer.Option(None, "--offload-folder", help="where disk-offloaded weights go "
                                              "(GANDA_OFFLOAD_FOLDER)"),
) -> None:
    """ganda: find, measure, disable and transplant Gather-and-Aggregate heads."""
    placement.apply_command_options(dtype, device_map, offload_folder)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(app)
    registry.register_plugin_commands(app)


_register_commands()


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


def _interrupted() -> int:
    note = runio.take_interrupt_note()
    print("ganda: interrupted" + (f"; {note}" if note else ""), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one line and exit 2, never a traceback; Ctrl-C exits 130.

    typer turns a KeyboardInterrupt inside a command into exit code 130 and returns it (with
    ``standalone_mode=False``), so the return value is the exit status."""
    runio.set_interrupt_note(None)
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="ganda")
    except GandaError as exc:
        print(f"ganda: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:  # typer/click exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return _interrupted() if code == 130 else code
    except OSError as exc:  # a full disk, a read-only file system: one line, not a traceback
        if exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"ganda: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except Exception as exc:  # usage errors from typer's click layer: one line, like every error
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain ``ganda``: the help is the answer
            exc.show()
            return int(exc.exit_code)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            print(f"ganda: error: {exc.format_message()}{hint}", file=sys.stderr)
            return int(exc.exit_code)
        if type(exc).__name__ == "Abort":
            return 1
        raise
    finally:
        runio.release_claims()
        placement.restore_command_options()
    if rc == 130:
        return _interrupted()
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
