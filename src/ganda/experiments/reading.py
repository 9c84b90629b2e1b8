"""How a run directory is read: its kind found (``result.json``'s ``kind``, or a file a registered
result class names) and the kind's registered class asked to read it. :func:`ganda.results.load`
and ``ganda report`` read every kind through here alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import registry
from .common import ExperimentResult, read_json_object


def result_class(kind: str) -> type[ExperimentResult]:
    """The class that reads, presents and draws results of ``kind``: its registered class, an
    :class:`ExperimentResult` for a kind nobody registered, and for a registered class that is no
    ExperimentResult (one with only ``from_json``, ``headline`` and ``draw``) an ExperimentResult
    that headlines and draws as that class does."""
    cls = registry.result_class(kind)
    if cls is None or (isinstance(cls, type) and issubclass(cls, ExperimentResult)):
        return cls or ExperimentResult
    if cls not in _SHOWN:
        _SHOWN[cls] = type(getattr(cls, "__name__", "Result"), (_Shown,), {
            "shown_by": cls, "title": getattr(cls, "title", ""), "table": getattr(cls, "table", "rows")})
    return _SHOWN[cls]


_SHOWN: dict[Any, type[ExperimentResult]] = {}


class _Shown(ExperimentResult):
    """An ExperimentResult that says and draws what its ``shown_by`` class makes of it."""

    shown_by: Any = None

    def _shown(self) -> Any:
        return self.shown_by.from_json(self.page())

    def headline(self) -> str:
        return self._shown().headline()

    def draw(self, out_dir: Path) -> list[Path]:
        return list(self._shown().draw(out_dir))


def run_files() -> list[str]:
    """Every file that makes a directory a run: ``result.json``, then each kind's own."""
    return list(dict.fromkeys(["result.json", *(f for f, _ in registry.kind_files())]))


def run_kind(run_dir: Path) -> str | None:
    """The kind of the run in ``run_dir``: its ``result.json``'s ``kind`` (``"?"`` where it names
    none), else the kind whose file it holds; None when it holds no run."""
    run_dir = Path(run_dir)
    if (run_dir / "result.json").is_file():
        d = read_json_object(run_dir / "result.json")
        return str(d.get("kind", "?"))
    return next((kind for f, kind in registry.kind_files() if (run_dir / f).is_file()), None)


def read_run(run_dir: Path) -> ExperimentResult | None:
    """The result in ``run_dir``, read by its kind's class (:func:`result_class`); None when the
    directory holds no run."""
    kind = run_kind(run_dir)
    return None if kind is None else result_class(kind).read(Path(run_dir))


__all__ = ["read_run", "result_class", "run_files", "run_kind"]
