"""Writing results safely: atomic files, run-directory locks, output checks.

Every result file ganda writes goes through :func:`atomic_open` / :func:`atomic_path` (or the
``write_text`` shorthand): the data goes to a temporary file beside the
target, is flushed to disk and then renamed over it, so a crash, a full disk or Ctrl-C leaves
either the old file or the new one, never half of one. A failed write is one
:class:`~ganda.errors.GandaError` line naming the file. JSON result files go through
:func:`write_json`, which writes every float to :data:`RESULT_DIGITS` significant digits.

Commands check their output paths before they load a model (:func:`check_output_file`,
:func:`check_output_dir`) and claim their run directory (:func:`claim_run_dir`): an exclusive
``flock`` on ``<dir>/.lock`` held for the whole run, so two runs never write into one directory.
The lock dies with the process, so a killed run never leaves a stale lock behind.

The two are the one output policy of every command that writes (docs/reliability.md): a run
directory holds one kind of run (:func:`run_kind`); nothing is written inside a directory that
holds a model (:func:`holds_model`), the loaded one or another; an existing file ganda did not
write is replaced only with ``--force`` (:func:`written_by_ganda`); a command refused after it
started leaves nothing it created (:func:`discard_claims`, called by the CLI on a refusal).

A :class:`Journal`'s config carries the weights' fingerprint (:mod:`ganda.fingerprint`), so that a
resumed run can tell that the model it measured has changed; :func:`ganda_version` is recorded in
every result file.

This module imports only the standard library and ganda modules that do (:mod:`ganda.errors`,
:mod:`ganda.registry`, :mod:`ganda.intervals`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import importlib.metadata as md
import json
import math
import os
import re
import shlex
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from . import registry
from .errors import GandaError
from .intervals import split

_UMASK = os.umask(0)
os.umask(_UMASK)

# ---------------------------------------------------------------------------------------------
# atomic writes


def write_error(path: str | Path, exc: OSError) -> GandaError:
    """The one-line error for a failed write of ``path``."""
    why = exc.strerror or str(exc)
    return GandaError(f"could not write {path}: {why}")


def _target(path: Path) -> Path:
    """Where a write of ``path`` lands: a symlink is followed, so the link itself survives."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); on success it replaces ``path``.

    For writers that take a file name (``savefig``, ``save_file``). An existing device or FIFO
    (``/dev/null``, ``/dev/full``) is written in place: there is nothing to replace atomically.
    On any error the temporary file is removed; an ``OSError`` becomes one ``GandaError`` line.
    """
    path = Path(path)
    target = _target(path)
    if target.is_dir():
        raise GandaError(f"cannot write {path}: it is a directory")
    if target.exists() and not target.is_file():
        try:
            yield target
        except OSError as exc:
            raise write_error(path, exc) from None
        return
    tmp: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{target.suffix}")
        os.close(fd)
        tmp = Path(name)
        yield tmp
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_UMASK
        os.chmod(tmp, mode)
        _fsync(tmp)
        os.replace(tmp, target)
        tmp = None
        with contextlib.suppress(OSError):  # a directory that cannot be synced still holds the file
            _fsync(target.parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` that publishes the file only if the block finishes (see :func:`atomic_path`).

    ``kwargs`` go to :func:`open` (``encoding``, ``newline``); text defaults to UTF-8."""
    if "w" not in mode:
        raise ValueError("atomic_open writes a whole file: mode must contain 'w'")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp:
        try:
            with open(tmp, mode, **kwargs) as f:
                yield f
        except OSError as exc:
            raise write_error(path, exc) from None


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


#: significant digits of every float in a JSON result file: an accuracy of 11/50 is written 0.22,
#: not 0.21999999999999997, and no score ganda computes is known to more digits than this
RESULT_DIGITS = 6


def map_floats(obj: Any, fn: Callable[[float], Any]) -> Any:
    """``obj`` with ``fn`` applied to every float, through nested dicts, lists and tuples (tuples
    become lists, as JSON writes them); everything else as it is."""
    if isinstance(obj, float):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_floats(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [map_floats(v, fn) for v in obj]
    return obj


def rounded(obj: Any, digits: int = RESULT_DIGITS) -> Any:
    """``obj`` with every finite float rounded to ``digits`` significant digits (:func:`map_floats`)."""
    return map_floats(obj, lambda x: float(f"{x:.{digits}g}") if math.isfinite(x) else x)


def json_text(obj: Any, indent: int | None = None) -> str:
    """``obj`` as JSON with its floats :func:`rounded`; anything JSON has no type for as its text."""
    return json.dumps(rounded(obj), indent=indent, default=str)


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """A JSON result file, atomically: floats to :data:`RESULT_DIGITS` significant digits."""
    return write_text(path, json_text(obj, indent) + "\n")


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every key of ``rows`` in order of first appearance: the columns of a table of records."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows of dicts as CSV, atomically: the columns are every key in order of first appearance,
    every interval as two columns (:func:`ganda.intervals.split`), other lists and dicts as JSON,
    floats to :data:`RESULT_DIGITS` as in the JSON results."""
    rows = [split(r) for r in rows]
    with atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns(rows))
        w.writeheader()
        for r in rows:
            w.writerow({k: (json_text(v) if isinstance(v, list | dict) else rounded(v)) for k, v in r.items()})
    return Path(path)


def ganda_version() -> str:
    """The installed ganda's version (``"?"`` when it runs from a source tree that is not installed)."""
    try:
        return md.version("ganda")
    except md.PackageNotFoundError:  # pragma: no cover
        return "?"


# ---------------------------------------------------------------------------------------------
# output checks (before any long run)


def _probe_dir(path: Path, shown: Path, option: str) -> None:
    """Fail unless a file can be created in ``path``'s nearest existing ancestor (or ``path``
    itself), which must be a directory: missing directories are created when written, not now."""
    d = path
    while not d.exists() and not d.is_symlink() and d.parent != d:
        d = d.parent
    if not d.is_dir():
        raise GandaError(f"{option} {shown}: {d} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise GandaError(f"{option} {shown}: cannot write in {d} (permission denied)")
    try:
        fd, name = tempfile.mkstemp(dir=d, prefix=".ganda-probe-")
    except OSError as exc:
        raise GandaError(f"{option} {shown}: cannot write in {d} ({exc.strerror or exc})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def check_output_file(path: str | Path, option: str = "--out", *, inputs: Sequence[str | Path] = (),
                      kind: str | None = None, force: bool = False) -> Path:
    """Check, before a run, that a result file can be written at ``path``; returns it.

    The target must not be a directory, and its nearest existing ancestor must be a writable
    directory (missing parents are created when the file is written, not now). It must not be one
    of the command's ``inputs`` (a file, or a directory: a model directory, whose files are never
    written), nor inside any directory that holds a model (:func:`holds_model`), whatever ``force``
    says. An existing file is replaced only when ganda wrote it as
    this ``kind`` of output (:func:`written_by_ganda`), or with ``force``."""
    path = Path(path).expanduser()
    target = _target(path)
    if target.is_dir():
        raise GandaError(f"{option} {path} is a directory; give a file name")
    if target.exists() and not target.is_file():
        if not os.access(target, os.W_OK):
            raise GandaError(f"{option} {path}: not writable")
        return path
    real = os.path.realpath(target)
    for inp in inputs:
        where = os.path.realpath(Path(inp).expanduser())
        if _inside(real, where):
            what = f"inside {inp}, which" if real != where else "a file that"
            raise GandaError(f"{option} {path} is {what} this command reads; ganda never writes over its inputs: "
                             "choose another path")
    check_not_model_dir(path, option, itself=False)  # any model's directory, not only the one this command loads
    if target.is_file() and not force and not written_by_ganda(target, kind):
        raise GandaError(f"{option} {path} exists and is not {KINDS.get(kind or '', 'a file')} that ganda wrote; "
                         "pass --force to replace it, or choose another path")
    _probe_dir(target.parent, path, option)
    return path


#: the kinds of output files a command may replace, as the error names them
KINDS = {"predictions": "a predictions file", "report": "a report page", "figure": "a figure",
         "attention": "an attention-maps file", "plan": "a plan"}
#: what ganda writes into every file of a kind (PNG: matplotlib's ``Software`` text chunk)
GENERATOR = "ganda"
_MARKS = {"report": b'<meta name="generator" content="ganda', "figure": b"Software\x00ganda",
          "attention": b'{"format":"ganda-attention/'}


def written_by_ganda(path: str | Path, kind: str | None) -> bool:
    """Whether the file at ``path`` is one ganda wrote as ``kind`` (see :data:`KINDS`), from its
    first bytes: the generator mark of a report page or figure, the format of an attention-maps
    file, the fields of a predictions line."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if kind == "predictions":
        line = head.split(b"\n", 1)[0]
        try:
            rec = json.loads(line)
        except ValueError:
            return False
        return isinstance(rec, dict) and {"id", "gold", "pred", "correct"} <= set(rec)
    if kind == "plan":  # ganda plan --out: a JSON list of plans, each naming what it costs
        try:
            with open(path, "rb") as f:
                plans = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return False
        return isinstance(plans, list) and bool(plans) and all(
            isinstance(p, dict) and {"what", "experiment", "flops", "seconds"} <= set(p) for p in plans)
    mark = _MARKS.get(kind or "")
    return mark is not None and mark in head


def check_not_inside(model: str | Path) -> None:
    """Refuse a model that holds a run directory this command claimed: its files would be written
    into the model's directory."""
    where = os.path.realpath(model)
    for d in _claims:
        if _inside(os.path.realpath(d), where):
            raise GandaError(f"--out {d} is inside the model directory {model}; ganda never writes into a model's "
                             "files: choose another --out")


def check_output_dir(path: str | Path, option: str = "--out") -> Path:
    """Check, before a run, that ``path`` is (or can be created as) a writable directory; returns it.

    Nothing is created: the nearest existing ancestor must be a writable directory."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise GandaError(f"{option} {path} is a file, not a directory")
    _probe_dir(path, path, option)
    return path


# ---------------------------------------------------------------------------------------------
# run-directory locks

_held: dict[str, list[Any]] = {}  # realpath -> [fd, count, directories created (deepest first), path]
_held_guard = threading.Lock()
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp(\.[^.]*)?$")  # atomic_path's temporary names
_claims: list[Path] = []


def _lock_key(path: Path) -> str:
    return os.path.realpath(path)


def acquire_run_dir(path: str | Path, option: str = "--out") -> Path:
    """Create ``path`` if needed and take its exclusive lock (re-entrant within a process).

    Another process holding it gives one line: ``another ganda run is writing to PATH (pid N)``.
    Pair every call with :func:`release_run_dir`."""
    path = Path(path).expanduser()
    check_output_dir(path, option)
    key = _lock_key(path)
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            return path
        created = [a for a in (path, *path.parents) if not a.exists()]  # removed again if left empty
        for _ in range(10):
            lock = path / ".lock"
            try:
                path.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~_UMASK)
            except FileNotFoundError:  # removed by a run that just ended
                continue
            except OSError as exc:
                raise GandaError(f"{option} {path}: cannot create the run directory ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise GandaError(f"another ganda run is writing to {path} (pid {pid}); wait for it to finish "
                                     "or choose another --out") from None
                raise GandaError(f"{option} {path}: cannot lock the run directory ({exc.strerror or exc})") from None
            try:  # the lock file may have been removed by a run that just ended: lock the file in place
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _held[key] = [fd, 1, created, path]
            _remove_stale_temps(path)
            return path
    raise GandaError(f"{option} {path}: cannot lock the run directory")


def _remove_stale_temps(d: Path) -> None:
    """Temporary files of a writer that was killed mid-write (nobody else writes here: we hold the lock)."""
    for f in d.iterdir():
        if _TEMP_NAME.match(f.name) and f.is_file():
            with contextlib.suppress(OSError):
                f.unlink()


def release_run_dir(path: str | Path) -> None:
    """Drop one hold on ``path``'s lock; the last one removes the lock file and unlocks it. A directory
    this process created and left empty (a run that failed before writing) is removed."""
    key = _lock_key(Path(path).expanduser())
    with _held_guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        fd, _, created, p = entry
        del _held[key]
        try:  # removed while still locked: a run starting now sees the file gone and makes a fresh one
            (p / ".lock").unlink()
            for d in created:
                if any(d.iterdir()):
                    break
                d.rmdir()
        except OSError:
            pass
        finally:
            os.close(fd)


@contextlib.contextmanager
def run_dir_lock(path: str | Path, option: str = "--out") -> Iterator[Path]:
    """``with run_dir_lock(out):`` holds ``out``'s lock for the block (see :func:`acquire_run_dir`)."""
    p = acquire_run_dir(path, option)
    try:
        yield p
    finally:
        release_run_dir(p)


def claim_run_dir(path: str | Path, option: str = "--out", *, kind: str | None = None,
                  models: Sequence[str | Path] = ()) -> Path:
    """For commands: the one output policy of a run directory, then its lock until :func:`release_claims`
    (the CLI calls it on exit).

    ``path`` must not be inside a directory that holds a model (``models``, the files the command
    loads, or any directory with a config.json and weights: :func:`check_not_model_dir`); with
    ``kind`` (the command that writes the run, e.g. ``"sweep"``; ``"model"``: a command that writes a
    model there, which may replace an earlier one), a directory that already holds
    another kind's run is refused, naming the kind found (:func:`run_kind`). What is in the
    directory now is remembered, so that a run refused later removes only what it created
    (:func:`discard_claims`)."""
    path = Path(path).expanduser()
    check_not_model_dir(path, option, models, itself=kind != "model")
    if kind not in (None, "model") and path.is_dir():
        found = run_kind(path)
        if found is not None and found[0] != kind:
            raise GandaError(f"{option} {path} holds a ganda {found[0]} run ({found[1]}); a {kind} run there would mix "
                             "two runs' files: choose another --out")
    before = _files(path) if kind != "model" else True  # a training's checkpoints outlive a refusal
    p = acquire_run_dir(path, option)
    _claims.append(p)
    _before.setdefault(_lock_key(p), before)
    return p


def run_kind(path: str | Path) -> tuple[str, str] | None:
    """The command whose run directory ``path`` is and the file that says so: the writer of
    result.json's ``kind``, else of the first registered run file present
    (:func:`ganda.registry.run_files`); None for a directory holding no run."""
    path = Path(path)
    res = path / "result.json"
    if res.is_file():
        try:
            kind = json.loads(res.read_text(errors="replace")).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        if isinstance(kind, str) and kind:
            return registry.writer(kind), f"its result.json is a {kind} result"
    if not path.is_dir() or next(path.iterdir(), None) is None:
        return None  # nothing to ask the result classes about
    for name, command in registry.run_files():
        if (path / name).is_file():
            return command, f"its {name}"
    return None


registry.register_run_file("grid.json", "grid")


#: the files that make a directory a model's (with a config.json beside them)
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.gguf", "pytorch_model*", "*.pt")


def _inside(real: str, where: str) -> bool:
    """Whether the resolved path ``real`` is ``where`` or lies in the directory ``where``."""
    return real == where or (os.path.isdir(where) and real.startswith(where.rstrip(os.sep) + os.sep))


def _model_around(d: Path, itself: bool) -> Path | None:
    """The first directory that holds a model among ``d`` (with ``itself``) and its ancestors."""
    return next((a for a in ((d, *d.parents) if itself else d.parents) if a.is_dir() and holds_model(a)), None)


def holds_model(d: str | Path) -> bool:
    """Whether ``d`` is a model directory: a config.json and weights."""
    d = Path(d)
    try:
        return (d / "config.json").is_file() and any(next(d.glob(g), None) is not None for g in WEIGHT_GLOBS)
    except OSError:
        return False


def check_not_model_dir(path: str | Path, option: str = "--out", models: Sequence[str | Path] = (), *,
                        itself: bool = True) -> None:
    """Refuse an output directory that is, or is inside, a model the command loads (``models``: its
    file or directory, as resolved when loaded) or any directory that holds a model (``itself``
    False: a directory above it; a command that writes a model, ``kind="model"``, may replace one)."""
    real = os.path.realpath(Path(path).expanduser())
    for m in models:
        if _inside(real, os.path.realpath(Path(m).expanduser())):
            raise GandaError(f"{option} {path} is inside the model directory {m}; ganda never writes into a model's "
                             f"files: choose another {option}")
    a = _model_around(Path(real), itself)
    if a is not None:
        raise GandaError(f"{option} {path} is inside the model directory {a} (a config.json and weights); ganda "
                         f"never writes into a model's files: choose another {option}")


_before: dict[str, set[str] | bool] = {}  # run directory -> its files when claimed (False: it did not exist)
_MANY = 20_000  # a directory holding more files than this is no run directory: nothing in it is removed


def _files(d: Path) -> set[str] | bool:
    """The files under ``d`` now; False when it does not exist, True when it holds too many to track."""
    if not d.is_dir():
        return False
    out: set[str] = set()
    for p in d.rglob("*"):
        out.add(str(p.relative_to(d)))
        if len(out) > _MANY:
            return True
    return out


def _keeps_units(f: Path) -> bool:
    """A journal holding finished units (more than its header): a resume point, kept after a refusal."""
    if f.suffix != ".jsonl":
        return False
    try:
        with open(f, "rb") as fh:
            return fh.read(1 << 20).count(b"\n") > 1
    except OSError:
        return False


def interrupt_summary() -> str | None:
    """What an interrupted command kept, for ``ganda: interrupted; ...``: its run directories and
    whether a rerun resumes (a journal of finished units) or starts over."""
    parts = []
    for p in claimed_dirs():
        if not p.is_dir():
            continue
        journals = sorted(str(q.relative_to(p)) for q in p.rglob("*.jsonl") if _keeps_units(q))
        if journals:
            parts.append(f"kept {p} ({', '.join(journals)}): rerun the same command to resume")
        elif any(q.name != ".lock" for q in p.iterdir()):
            parts.append(f"kept {p} with no finished unit: a rerun starts over")
        else:
            parts.append(f"nothing written to {p}")
    return "; ".join(parts) or None


def discard_claims() -> list[Path]:
    """After a refused run: remove what it created in its run directories (not what was there
    before, not a journal of finished units, which a rerun resumes from); returns what is kept."""
    kept: list[Path] = []
    for p in claimed_dirs():
        before = _before.get(_lock_key(p), True)
        if before is True or not p.is_dir():
            continue
        new = sorted((q for q in p.rglob("*") if before is False or str(q.relative_to(p)) not in before),
                     key=lambda q: len(q.parts), reverse=True)
        for q in new:
            if q.name == ".lock" and q.parent == p:
                continue
            with contextlib.suppress(OSError):
                if q.is_dir() and not q.is_symlink():
                    if not any(q.iterdir()):
                        q.rmdir()
                elif _keeps_units(q):
                    kept.append(q)
                else:
                    q.unlink()
    return kept


def claimed_dirs() -> list[Path]:
    """The run directories this command has claimed (its output), first claimed first."""
    return list(dict.fromkeys(_claims))


def release_claims() -> None:
    """Release every lock taken with :func:`claim_run_dir` (last claimed first)."""
    while _claims:
        p = _claims.pop()
        if p not in _claims:
            _before.pop(_lock_key(p), None)
        release_run_dir(p)


# ---------------------------------------------------------------------------------------------
# run journals


class Journal:
    """A resumable run's record: a header line with the run's config, then one JSON line per
    finished unit (a head, a batch of prompts), each flushed as soon as it is written.

    Opening reads what an earlier run left: a torn last line (a write cut by a kill) is cut off,
    any other line that is not a record (``check(line)`` says what is wrong with one, or None) is
    refused with its line number and what is wrong,
    and a header whose config differs from this run's is refused in one line naming what differs
    (the weights' fingerprint and dtype are part of the config, so a resume never mixes two
    models' numbers). ``records`` holds the earlier run's units; :meth:`append` adds one.
    """

    def __init__(self, path: str | Path, config: dict[str, Any], what: str, *, resume: bool = True,
                 check: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        self.path = Path(path)
        self.config = config
        self.what = what
        self.resume = resume
        self.check = check
        self.records: list[dict[str, Any]] = []
        self.fresh = True  # no earlier unit was found
        self._fh: IO[str] | None = None

    def open(self) -> Journal:
        """Read (and check) what is there, or start the file with this run's header."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            self.path.unlink(missing_ok=True)
        lines = read_journal(self.path, self.check)
        if lines:
            old = lines[0].get("config") if lines[0].get("type") == "header" else None
            self._check_config(old)
            self.records = lines[1:]
            self.fresh = False
        else:
            write_text(self.path, json.dumps({"type": "header", "config": self.config}) + "\n")
        try:
            self._fh = self.path.open("a")
        except OSError as exc:
            raise write_error(self.path, exc) from None
        return self

    def _check_config(self, old: Any) -> None:
        cfg = self.config
        if old == cfg:
            return
        if isinstance(old, dict) and "weights" in cfg and old.get("model") == cfg.get("model") \
                and old.get("weights", cfg["weights"]) != cfg["weights"]:
            raise GandaError(f"the weights of {cfg['model']} changed since this run started (fingerprint "
                             f"{old.get('weights')}, now {cfg['weights']}); use --no-resume or another --out")
        keys = _differing(old, cfg) if isinstance(old, dict) else []
        what = f"{', '.join(keys)} differ" if keys else "model, task, prompts or heads differ"
        raise GandaError(f"{self.path} holds a different {self.what} ({what}); use --no-resume to start over "
                         "or another --out")

    def append(self, rec: dict[str, Any]) -> None:
        """Write one unit's line and flush it (a kill after this keeps it)."""
        if self._fh is None:
            return
        try:
            self._fh.write(json.dumps(rec) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


def _differing(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The keys whose values differ, a mapping's inner keys named (``options.top``, not ``options``)."""
    out = []
    for k in sorted({*old, *new}):
        a, b = old.get(k), new.get(k)
        if a != b:
            inner = _differing(a, b, f"{prefix}{k}.") if isinstance(a, dict) and isinstance(b, dict) else []
            out += inner or [f"{prefix}{k}"]
    return out


def read_journal(path: str | Path, problem: Callable[[dict[str, Any]], str | None] | None = None) -> list[dict[str, Any]]:
    """The complete lines of a journal (empty when there is none). A torn last line (no newline:
    a write cut short) is cut off the file; a complete line that is not a JSON object, or that
    ``problem(line)`` finds wrong (it returns what is wrong, or None), is one error naming the file,
    the line number and what is wrong with it: the file is damaged, and a resume would mix it in."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    out: list[dict[str, Any]] = []
    start = 0
    while (nl := data.find(b"\n", start)) >= 0:
        number = len(out) + 1
        why = _line_problem(data[start:nl], number, problem)
        if why is not None:
            raise GandaError(f"{path}, line {number}: {why}; the file is damaged (a resume would mix its numbers in): "
                             "use --no-resume to start over, or another --out")
        out.append(json.loads(data[start:nl]))
        start = nl + 1
    if start != len(data):  # a torn last line
        with path.open("r+b") as f:
            f.truncate(start)
    return out


def _line_problem(line: bytes, number: int, problem: Callable[[dict[str, Any]], str | None] | None) -> str | None:
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return "not JSON"
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a record"
    kind = rec.get("type")
    if number == 1:
        return None if kind == "header" else "not a journal's header"
    if kind == "header":
        return "a record of type 'header'"
    return problem(rec) if problem is not None else None


# ---------------------------------------------------------------------------------------------
# what an interrupted run tells the user

_interrupt_note: str | None = None


def set_interrupt_note(note: str | None) -> None:
    """What ``ganda: interrupted; ...`` should add if the run is interrupted now (None: nothing)."""
    global _interrupt_note
    _interrupt_note = note


_argv: list[str] | None = None


def set_argv(argv: list[str] | None) -> None:
    """The arguments of the command being run (None: the process's), recorded with its results."""
    global _argv
    _argv = None if argv is None else list(argv)


def command_line() -> str:
    """The command as typed, recorded with its results: the arguments :func:`ganda.cli.main` was
    given (a Python caller's list, :func:`set_argv`), else the process's."""
    return "ganda " + " ".join(shlex.quote(a) for a in (_argv if _argv is not None else sys.argv[1:]))


def take_interrupt_note() -> str | None:
    """The current interrupt note, cleared."""
    global _interrupt_note
    note, _interrupt_note = _interrupt_note, None
    return note


__all__ = [
    "Journal", "read_journal", "acquire_run_dir", "check_not_model_dir", "discard_claims", "holds_model", "interrupt_summary", "run_kind", "atomic_open", "atomic_path", "check_output_dir", "check_output_file", "claim_run_dir",
    "claimed_dirs", "release_claims", "release_run_dir", "run_dir_lock", "set_interrupt_note",
    "take_interrupt_note", "set_argv", "command_line", "write_error", "write_text",
]
