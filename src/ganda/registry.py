"""The places to extend ganda: model families and names, tasks, experiments and result kinds.

* **Models**: :func:`register_family` says which adapter serves which ``config.model_type`` (and, for
  architectures transformers does not build, how to load one); :func:`register_resolver` turns a
  name such as ``lab-llama`` into the local directory it loads from.
* **Tasks**: :func:`register_task` names a :class:`~ganda.tasks.base.Task` class (or its
  ``"module:Class"`` path, imported on first use). The task declares its options and chance level.
  :func:`register_group` names a group of tasks scored together (their mean accuracy).
* **Experiments**: :func:`register_experiment` names an :class:`~ganda.experiments.base.Experiment`
  class (or its ``"module:Class"`` path): its options (a config dataclass that checks itself), how
  it runs, its result and its costs. The command line, ``ganda grid`` and ``ganda plan`` find
  experiments here, so a new one is one file.
* **Result kinds**: :func:`register_result` names the result class of a kind: the only reader of
  its run directories (``result.json`` of that kind, or the class's own ``files``) for
  :func:`ganda.results.load` and ``ganda report`` (:class:`ganda.experiments.ExperimentResult`:
  ``read``, ``tables``, ``title``, ``headline()``, ``draw(out_dir)``).

Packages outside ganda register through an entry point in the group ``ganda.plugins`` whose
target (a module or any object) has ``register()``, called once for the registries, and
optionally ``register_cli(app)``, called with the typer app to add commands. Plugins load at
the command line's start and, in Python, on the first lookup that misses.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import GandaError

if TYPE_CHECKING:
    from .models.base import ModelAdapter
    from .tasks.base import Task

log = logging.getLogger(__name__)

PLUGIN_GROUP = "ganda.plugins"


def resolve_target(target: Any) -> Any:
    """``target`` itself, or the object a ``"module:attr"`` path names (imported now)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    if not attr:
        raise GandaError(f"registry target {target!r} is not of the form 'module:attr'")
    return getattr(importlib.import_module(module), attr)


def _resolved(table: dict[str, Any], name: str, *, plugins: bool = True) -> Any:
    """What ``name`` is registered to in ``table``, imported once and kept (``plugins``: loaded on a
    miss first), or None."""
    if plugins and name not in table:
        load_plugins()
    target = table.get(name)
    if target is None:
        return None
    table[name] = resolve_target(target)
    return table[name]


# ---- model families and names ---------------------------------------------------------------

_FAMILIES: list[type[ModelAdapter]] = []
#: ``config.model_type`` -> human name, for the list of supported architectures.
MODEL_TYPES: dict[str, str] = {}
#: ``config.model_type`` -> ``fn(path) -> model`` for architectures transformers does not build.
LOADERS: dict[str | None, Callable[[Path], Any]] = {}


def register_family(adapter_cls: type[ModelAdapter], model_types: dict[str, str] | None = None,
                    loader: Callable[[Path], Any] | None = None, *, generic: bool = False) -> None:
    """Serve models that ``adapter_cls.matches`` with that adapter.

    ``model_types`` maps each ``config.model_type`` the family loads to a human name (listed when
    an architecture is refused); ``loader`` builds a model from a directory for model types that
    transformers cannot build. Families registered later are tried first, so a specific family
    wins over a generic one; ``generic=True`` puts the family after all others instead.
    """
    if adapter_cls not in _FAMILIES:
        if generic:
            _FAMILIES.append(adapter_cls)
        else:
            _FAMILIES.insert(0, adapter_cls)
    MODEL_TYPES.update(model_types or {})
    if loader is not None:
        for model_type in model_types or {}:
            LOADERS[model_type] = loader


def families() -> list[type[ModelAdapter]]:
    """The registered adapter classes, in the order they are tried."""
    return list(_FAMILIES)


def unsupported(model_type: Any) -> GandaError:
    """The error for an architecture no registered family serves (it lists those that are)."""
    names = ", ".join(f"{v} ({k})" for k, v in sorted(MODEL_TYPES.items()))
    return GandaError(f"unsupported architecture {model_type!r}; ganda supports: {names}")


def check_model_type(model_type: str | None) -> None:
    """Refuse a ``config.model_type`` that no registered family loads."""
    if model_type not in MODEL_TYPES:
        raise unsupported(model_type)


def adapter_for(model: Any, tokenizer: Any, spec: str) -> ModelAdapter:
    """The adapter of the first family (in :func:`families` order) whose ``matches`` accepts ``model``:
    families registered later are tried first, so specific ones come before the generic Transformer."""
    for cls in _FAMILIES:
        if cls.matches(model):
            return cls(model, tokenizer, spec)
    raise unsupported(getattr(getattr(model, "config", None), "model_type", type(model).__name__))


@dataclass(frozen=True)
class Resolver:
    match: str | Callable[[str], bool]
    fn: Callable[[str], Path | None]
    names: Callable[[], Iterable[str]] | None = None
    label: str = "a registered name"

    def accepts(self, spec: str) -> bool:
        return spec.startswith(self.match) if isinstance(self.match, str) else bool(self.match(spec))


_RESOLVERS: list[Resolver] = []


def register_resolver(prefix_or_predicate: str | Callable[[str], bool], fn: Callable[[str], Path | None], *,
                      names: Callable[[], Iterable[str]] | None = None, label: str = "a registered name") -> None:
    """Let model specs that start with a prefix (or satisfy a predicate) load from ``fn(spec)``.

    ``fn`` returns the local directory or file for the spec, or None when it does not know it;
    ``names`` lists the names it knows and ``label`` says what they are, both for the error that
    an unknown spec gets. Resolvers are consulted after aliases and existing paths.
    """
    _RESOLVERS.append(Resolver(prefix_or_predicate, fn, names, label))


def resolve_model(spec: str) -> Path | None:
    """The path a registered resolver gives ``spec`` (plugins loaded on a miss), or None."""
    for attempt in range(2):
        for r in _RESOLVERS:
            if r.accepts(spec):
                path = r.fn(spec)
                if path is not None:
                    return Path(path)
        if attempt == 0 and not load_plugins():
            break
    return None


def resolver_names() -> list[tuple[str, list[str]]]:
    """``(label, names)`` of every resolver that lists its names (for error messages)."""
    load_plugins()
    return [(r.label, sorted(r.names())) for r in _RESOLVERS if r.names is not None]


# ---- tasks ----------------------------------------------------------------------------------

_TASKS: dict[str, Any] = {}
_NUMBER_OPTION: dict[str, str] = {}


def register_task(name: str, target: type[Task] | str, *, number_option: str | None = None) -> None:
    """Make ``name`` build the task ``target`` (a Task class or its ``"module:Class"`` path).

    ``number_option`` lets a number written after the name set that option in lists of tasks
    (``number_option="pairs"``: ``kv20`` is ``kv`` with 20 pairs).
    """
    _TASKS[name] = target
    if number_option is not None:
        _NUMBER_OPTION[name] = number_option
    else:
        _NUMBER_OPTION.pop(name, None)


def task_names() -> list[str]:
    """Every registered task name (plugins' included), sorted."""
    load_plugins()
    return sorted(_TASKS)


def task_class(name: str) -> type[Task] | None:
    """The task class registered as ``name`` (plugins loaded on a miss), or None."""
    return _resolved(_TASKS, name)


def parse_task_name(text: str) -> tuple[str, dict[str, Any]] | None:
    """``"kv20"`` -> ``("kv", {"pairs": 20})``, ``"mmlu"`` -> ``("mmlu", {})``; None when unknown."""
    for attempt in range(2):
        if text in _TASKS:
            return text, {}
        for name, option in sorted(_NUMBER_OPTION.items(), key=lambda kv: -len(kv[0])):
            rest = text[len(name):]
            if text.startswith(name) and rest.isdigit():
                return name, {option: int(rest)}
        if attempt == 0 and not load_plugins():
            break
    return None


_GROUPS: dict[str, tuple[str, ...]] = {}


def register_group(name: str, members: tuple[str, ...] | list[str]) -> None:
    """Make ``name`` a task group (lm-eval's ``group``): its members' accuracies, each scored as a
    task of its own, and their unweighted mean as the group's score (ganda's ``knowledge``)."""
    _GROUPS[name] = tuple(members)


def group_members(name: str) -> tuple[str, ...] | None:
    """The member tasks of group ``name`` (plugins loaded on a miss), or None when it is no group."""
    if name not in _GROUPS and name not in _TASKS:
        load_plugins()
    return _GROUPS.get(name)


def group_names() -> list[str]:
    load_plugins()
    return sorted(_GROUPS)


def number_option(name: str) -> str | None:
    """The option a number after task ``name`` sets (``"pairs"`` for ``kv``), if any."""
    return _NUMBER_OPTION.get(name)


# ---- experiments ----------------------------------------------------------------------------

_EXPERIMENTS: dict[str, Any] = {}
_SUMMARIES: dict[str, str] = {}
_NO_COMMAND: set[str] = set()
#: the module that registers ganda's own experiments, imported on the first lookup
BUILTIN_EXPERIMENTS = "ganda.experiments"


def register_experiment(name: str, target: Any, *, summary: str | None = None, command: bool = True,
                        results: dict[str, Any] | None = None) -> None:
    """Make ``name`` run the experiment ``target`` (an ``Experiment`` class or its ``"module:Class"``
    path, imported on first use). ``summary``: its one line, listed by ``ganda --help`` without
    importing the class (default: the class's ``summary``). ``command``: ``ganda NAME`` runs it
    (False for an alias, and for an experiment only costed by ``ganda plan``). ``results``: the
    result kinds it writes and their classes (:func:`register_result` with ``writer=name``)."""
    _EXPERIMENTS[name] = target
    if summary is not None:
        _SUMMARIES[name] = summary
    (_NO_COMMAND.discard if command else _NO_COMMAND.add)(name)
    for kind, cls in (results or {}).items():
        register_result(kind, cls, writer=name)


def experiment_target(name: str) -> Any:
    """What ``name`` is registered to (a class or its ``"module:Class"`` path), without importing it."""
    return _EXPERIMENTS[name]


def experiment_summary(name: str) -> str:
    """The one-line summary of experiment ``name``: as registered, else the class's own."""
    _load_experiments()
    if name in _SUMMARIES:
        return _SUMMARIES[name]
    return getattr(experiment(name), "summary", "") or ""


def command_experiments() -> list[str]:
    """The experiments that ``ganda NAME`` runs (registered with ``command``), without importing
    their classes."""
    _load_experiments()
    return sorted(n for n in _EXPERIMENTS if n not in _NO_COMMAND)


def _load_experiments() -> None:
    if BUILTIN_EXPERIMENTS not in sys.modules:
        importlib.import_module(BUILTIN_EXPERIMENTS)
    load_plugins()


def experiment_names(ordered: bool = True) -> list[str]:
    """Every registered experiment (ganda's own and plugins'), sorted (``ordered=False``: in the
    order they were registered)."""
    _load_experiments()
    return sorted(_EXPERIMENTS) if ordered else list(_EXPERIMENTS)


def experiment(name: str) -> Any:
    """The experiment class registered as ``name``; one line naming the known ones otherwise."""
    if name not in _EXPERIMENTS:
        _load_experiments()
    cls = _resolved(_EXPERIMENTS, name, plugins=False)
    if cls is None:
        raise GandaError(f"unknown experiment {name!r}; known: {', '.join(sorted(_EXPERIMENTS))}")
    if name in _SUMMARIES and not cls.__dict__.get("summary"):
        cls.summary = _SUMMARIES[name]
    return cls


# ---- experiment result kinds ----------------------------------------------------------------

class ResultKind(Protocol):
    """The least a result class has: ``ganda report`` rebuilds it from ``result.json`` for its
    headline and figures, and reads its tables as an ``ExperimentResult``'s. A subclass of
    :class:`ganda.experiments.ExperimentResult` reads and presents itself."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ResultKind: ...

    def headline(self) -> str: ...

    def draw(self, out_dir: Path) -> list[Path]: ...


_RESULTS: dict[str, Any] = {}
_WRITERS: dict[str, str] = {}
_RUN_FILES: dict[str, str] = {}


def register_result(kind: str, target: type[ResultKind] | str, *, writer: str | None = None) -> None:
    """Make run directories of ``kind`` read as ``target`` (a class or ``"module:Class"``);
    ``writer``: the command that writes them, where it is not spelled as the kind."""
    _RESULTS[kind] = target
    if writer is not None:
        _WRITERS[kind] = writer


def writer(kind: str) -> str:
    """The command that writes results of ``kind`` (the kind itself where none was registered):
    the name the output policy gives a run directory that holds one."""
    if kind not in _WRITERS:
        load_plugins()
    return _WRITERS.get(kind, kind)


def register_run_file(name: str, command: str) -> None:
    """Make a directory holding the file ``name`` a run of ``command`` for the output policy (for
    a command whose runs hold no result kind of their own, e.g. ``ganda grid``'s ``grid.json``)."""
    _RUN_FILES[name] = command


def kind_files(*, claims: bool = False) -> list[tuple[str, str]]:
    """``(file, kind)``: the files besides ``result.json`` that make a directory a run of a result
    kind, each kind's first file before any kind's second (a finished sweep's before a journal);
    with ``claims``, then each kind's claims (an unfinished run's journal, which the output policy
    guards but a reader cannot read)."""
    load_plugins()
    by_kind = [(kind, tuple(getattr(result_class(kind), "files", ()))) for kind in result_kinds()]
    out = [(files[i], kind) for i in range(max((len(f) for _, f in by_kind), default=0))
           for kind, files in by_kind if i < len(files)]
    if claims:
        out += [(f, kind) for kind in result_kinds() for f in getattr(result_class(kind), "claims", ())]
    return out


def run_files() -> list[tuple[str, str]]:
    """``(file, command)``: the files besides ``result.json`` that make a directory a command's
    run for the output policy: each result kind's files and claims (:func:`kind_files`), then
    the other registered run files."""
    return [(f, writer(kind)) for f, kind in kind_files(claims=True)] + list(_RUN_FILES.items())


def result_class(kind: str) -> type[ResultKind] | None:
    """The result class registered for ``kind`` (plugins loaded on a miss), or None."""
    return _resolved(_RESULTS, kind)


def result_kinds() -> list[str]:
    load_plugins()
    return sorted(_RESULTS)


# ---- plugins --------------------------------------------------------------------------------

_PLUGINS: dict[str, Any] | None = None
PLUGIN_ERRORS: dict[str, str] = {}


def load_plugins() -> bool:
    """Load every ``ganda.plugins`` entry point once and call its ``register()``.

    Returns True the first time (when loading may have added entries), False afterwards. A plugin
    that fails to load is logged and left out (its error stays in ``PLUGIN_ERRORS``), so one broken
    package does not stop ganda.
    """
    global _PLUGINS
    if _PLUGINS is not None:
        return False
    _PLUGINS = {}
    for ep in md.entry_points(group=PLUGIN_GROUP):
        try:
            plugin = ep.load()
            if hasattr(plugin, "register"):
                plugin.register()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the core
            PLUGIN_ERRORS[ep.name] = f"{type(exc).__name__}: {exc}"
            log.warning("ganda plugin %r (%s) failed to load: %s", ep.name, ep.value, exc)
            continue
        _PLUGINS[ep.name] = plugin
    return True


def plugins() -> dict[str, Any]:
    """The loaded plugins by entry-point name."""
    load_plugins()
    return dict(_PLUGINS or {})


def register_plugin_commands(app: Any) -> None:
    """Call ``register_cli(app)`` of every plugin that has one (the command line's start-up)."""
    for plugin in plugins().values():
        if hasattr(plugin, "register_cli"):
            plugin.register_cli(app)


__all__ = [
    "LOADERS", "MODEL_TYPES", "PLUGIN_GROUP", "ResultKind", "adapter_for", "check_model_type", "experiment",
    "experiment_names", "families", "unsupported",
    "group_members", "group_names", "register_group",
    "load_plugins", "number_option", "register_experiment",
    "parse_task_name", "plugins", "register_family", "register_plugin_commands", "register_resolver",
    "kind_files", "register_result", "register_task", "resolve_model", "resolve_target", "result_class", "result_kinds",
    "resolver_names", "task_class", "task_names",
]
