"""Progress bars that suit where they are written: a live bar on a terminal, one plain line every
half minute in a log file (no carriage-return updates to flood it), nothing under ``--quiet``.

Every ganda module takes its bar from here (``from ganda.progress import tqdm``, a drop-in for
``tqdm.auto.tqdm``), so a command's ``--quiet`` and the log-file behaviour hold at every call site
without each one knowing about them. ``GANDA_PROGRESS_EVERY`` sets the seconds between log lines.
:func:`cpu_clock` times a phase the way every result reports it: wall and CPU seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import IO, Any

from tqdm.auto import tqdm as _tqdm

from .errors import env_number

LOG_EVERY = 30.0  # seconds between progress lines when stderr is not a terminal

_state = {"quiet": False}

#: the loggers and warning modules of the libraries a command runs, silenced below errors under ``--quiet``
THIRD_PARTY = ("transformers", "lm_eval", "lm-eval")
_BARS_OFF = "HF_HUB_DISABLE_PROGRESS_BARS"  # read when huggingface_hub (and transformers' bars) load
_saved: dict[str, Any] = {}


@contextlib.contextmanager
def cpu_clock() -> Iterator[dict[str, float]]:
    """Wall and CPU seconds of the block (``box["wall"]``, ``box["cpu"]`` once it ends)."""
    box: dict[str, float] = {}
    t, c = time.perf_counter(), time.process_time()
    try:
        yield box
    finally:
        box["wall"], box["cpu"] = time.perf_counter() - t, time.process_time() - c



def set_quiet(on: bool) -> None:
    """Silence every progress bar (``--quiet``) until :func:`set_quiet` is called with False, and
    with them the third-party output a command would print (:func:`quiet_third_party`)."""
    if bool(on) != _state["quiet"]:
        quiet_third_party(bool(on))
    _state["quiet"] = bool(on)


def quiet_third_party(on: bool) -> None:
    """``on``: transformers' and lm-eval's loggers at ERROR, their warnings ignored and transformers'
    (huggingface_hub's) progress bars off; off: every one of them as it was before."""
    if on:
        if _saved:  # already quiet: the state to restore is the one saved first
            return
        _saved.update(levels={n: logging.getLogger(n).level for n in THIRD_PARTY}, env=os.environ.get(_BARS_OFF),
                      filters=list(warnings.filters), bars=_transformers_bars(None))
        for name in THIRD_PARTY:
            logging.getLogger(name).setLevel(logging.ERROR)
            warnings.filterwarnings("ignore", module=name.replace("-", "_") + r"(\.|$)")
        os.environ[_BARS_OFF] = "1"
        _transformers_bars(False)
        return
    if not _saved:
        return
    for name, level in _saved["levels"].items():
        logging.getLogger(name).setLevel(level)
    warnings.filters[:] = _saved["filters"]
    if _saved["env"] is None:
        os.environ.pop(_BARS_OFF, None)
    else:
        os.environ[_BARS_OFF] = _saved["env"]
    if _saved["bars"]:  # bars that were on go back on (huggingface_hub warns where its variable was read as set)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _transformers_bars(True)
    _saved.clear()


def _transformers_bars(on: bool | None) -> bool | None:
    """Whether transformers' progress bars are on (None: transformers not loaded), switched to ``on``
    first unless it is None. transformers loaded later reads :data:`_BARS_OFF`."""
    tf_logging = sys.modules.get("transformers.utils.logging")
    if tf_logging is None:
        return None
    if on is not None:
        (tf_logging.enable_progress_bar if on else tf_logging.disable_progress_bar)()
    return bool(tf_logging.is_progress_bar_enabled())


def is_quiet() -> bool:
    """Whether ``--quiet`` is in force: progress bars and notes on stderr are left out."""
    return _state["quiet"]


def note(text: str) -> None:
    """One line for the user on stderr (an estimate, a hint), left out under ``--quiet``."""
    if not _state["quiet"]:
        print(text, file=sys.stderr, flush=True)


def log_every() -> float:
    """Seconds between progress lines in a log file: ``GANDA_PROGRESS_EVERY`` or 30. A value that is
    not a number of seconds is refused, as ``GANDA_THREADS`` is (the CLI checks it at start)."""
    return float(env_number("GANDA_PROGRESS_EVERY", LOG_EVERY, "seconds"))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Lines:
    """A file for tqdm that writes each status as its own line: tqdm redraws a bar with ``\\r`` and
    cursor moves, which a log file keeps as one ever-growing line of overwritten updates."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, s: str) -> None:
        text = s.replace("\r", "").replace("\x1b[A", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class tqdm(_tqdm):  # noqa: N801 - a drop-in for tqdm.auto.tqdm keeps its name
    """``tqdm.auto.tqdm`` that is silent under ``--quiet`` and writes a plain line at most every
    :func:`log_every` seconds (and none for a bar that ends sooner) when its stream is not a terminal."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if _state["quiet"]:
            kwargs["disable"] = True
        elif not kwargs.get("disable"):
            stream = kwargs.get("file") or sys.stderr
            if not _is_terminal(stream):
                every = log_every()
                kwargs.update(disable=False, file=_Lines(stream), ascii=True,
                              mininterval=max(float(kwargs.get("mininterval") or 0.1), every),
                              maxinterval=max(float(kwargs.get("maxinterval") or 10.0), every),
                              delay=max(float(kwargs.get("delay") or 0.0), every))
        super().__init__(*args, **kwargs)
