"""Sweeps on Ray: the same files as a local run, scored by a pool of actors.

A sweep (:func:`ganda.sweep.run_sweep`, and every command built on it: ``sweep``, the exact
verification of ``rank``, ``grid``) splits into work units: one fixed head batch of a layer (the
batches a local run uses) × one shard of the prompts. :class:`RayScorer` is a drop-in for the
sweep's local scorer (:func:`ganda.sweep.scored_by`): each Ray actor loads the model once (from
the spec every node can reach), takes units as it frees up, and returns each unit's per-prompt
log-likelihoods; the driver joins a batch's shards in prompt order and hands batches back in the
canonical order, so the sweep writes ``progress.jsonl`` and the result files exactly as a local run
does, and a restarted driver resumes from them (nothing finished is recomputed).

Other experiments hand their own units to the same pool: :func:`map_units` runs ``fn(model, *unit)``
for each unit on the actors inside :func:`ray_sweeps` (in this process outside it), and yields the
results in unit order; ``extends`` (a task × a condition × a prompt shard) and ``prune`` (a prompt
shard of the pruning curve and of remove-and-restore) join them into the local run's files.

Faults. A unit whose actor dies (SIGKILL, node lost) goes back to the front of the queue and the
next free actor takes it; Ray restarts the dead actor, which reloads the model. A unit whose
actor dies ``max_crashes`` times stops the run with one line, as does a unit that raises (a
:class:`GandaError` or any exception is deterministic: it is never retried).

Placement. With GPUs in the cluster each actor asks for ``gpus_per_actor`` GPUs (one model replica
per GPU by default; more spread one model over several with ``--device-map auto``); otherwise for
``cpus_per_actor`` cores, and pins torch to that many threads, so N actors on N cores do not
oversubscribe. ``GANDA_DTYPE``, ``GANDA_DEVICE``, ``GANDA_DEVICE_MAP`` and ``GANDA_OFFLOAD_FOLDER``
(the root ``--dtype``/``--device-map`` options) travel to every actor.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import GandaError, at_least, env_number
from .heads import HeadId
from .models import hub
from .models.base import ModelAdapter
from .models.loading import load_model
from .prepared import Prepared, prepare_all
from .sweep import Batching, batching, engine_for, scored_by, weights_fingerprint
from .tasks.base import Example

# environment that decides how a model loads: the root options set it, every actor gets it
PLACEMENT_ENV = ("GANDA_DTYPE", "GANDA_DEVICE", "GANDA_DEVICE_MAP", "GANDA_OFFLOAD_FOLDER", "GANDA_CACHE")


@dataclass
class RayOptions:
    """How the pool is built. ``address``: ``local`` starts a Ray instance on this machine with its
    cores; anything else (``auto``, ``ray://head:10001``, ``head:6379``) joins that cluster."""

    address: str = "local"
    actors: int | None = None  # default: one per GPU (gpus_per_actor each), else one per cpus_per_actor cores
    cpus_per_actor: int = field(default_factory=lambda: int(env_number("GANDA_RAY_CPUS", 1, "CPUs", low=1, whole=True)))
    # default: 1 where the cluster has GPUs, else 0; more (GANDA_RAY_GPUS=2) with --device-map auto
    gpus_per_actor: float | None = field(default_factory=lambda: env_number("GANDA_RAY_GPUS", None, "GPUs"))
    shards: int | None = None  # prompt shards per head batch (default: enough units to keep every actor busy)
    max_crashes: int = 3  # a unit whose actor dies this many times stops the run
    allow_pickle: bool = False
    # fault drills (docs/distributed.md): {"delay": seconds per unit, "fail_head": "L1H0"}; GANDA_RAY_DRILL (JSON)
    drill: dict[str, Any] = field(default_factory=lambda: _drill_env())


def _drill_env() -> dict[str, Any]:
    raw = os.environ.get("GANDA_RAY_DRILL", "").strip()
    try:
        drill = json.loads(raw) if raw else {}
    except ValueError:
        drill = None
    if not isinstance(drill, dict):
        raise GandaError(f"GANDA_RAY_DRILL must be a JSON object such as {{\"delay\": 0.5}}, got {raw!r}")
    return drill


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise GandaError("--ray needs Ray: pip install 'ganda[distributed]' (or pip install 'ray>=2.9')") from None
    return ray


CONNECT_TIMEOUT_S = 10.0  # how long an address may take to answer (GANDA_RAY_CONNECT_TIMEOUT)


def ray_installed() -> bool:
    """Whether Ray can be imported here (without importing it: that takes seconds)."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def check_reachable(address: str) -> None:
    """Refuse, after at most ``GANDA_RAY_CONNECT_TIMEOUT`` seconds (default
    :data:`CONNECT_TIMEOUT_S`), a cluster address (``HOST:PORT``, ``ray://HOST:PORT``) where nothing
    accepts a connection: Ray itself would retry for many minutes, printing its client's logs.
    ``local`` and ``auto`` are left to Ray (they name no host)."""
    if address in ("local", "auto"):
        return
    timeout = env_number("GANDA_RAY_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S, "seconds") or CONNECT_TIMEOUT_S
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, "10001" if address.startswith("ray://") else "6379"
    try:
        where = (host.strip("[]") or "127.0.0.1", int(port))
    except ValueError:
        raise GandaError(f"--ray {address}: expected local, auto, HOST:PORT or ray://HOST:PORT") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(where, timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
        if time.monotonic() + 0.5 >= deadline:
            raise GandaError(f"--ray {address}: no Ray cluster answered at {where[0]}:{where[1]} within {timeout:g} s "
                             f"({why}); start one there (ray start --head) or use --ray local")
        time.sleep(0.5)


def connect(address: str = "local") -> None:
    """Start (``local``) or join (an address) Ray once per process; an existing connection is kept.
    An address where nothing answers is refused after a bounded wait (:func:`check_reachable`)."""
    ray = _ray()
    if ray.is_initialized():
        return
    check_reachable(address)
    try:
        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}  # a command's stderr stays its own
        if address == "local":
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, **quiet)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise GandaError(f"--ray {address}: could not reach a Ray cluster ({str(exc).splitlines()[0]})") from None


class _Worker:
    """One Ray actor: the model loaded once, a sweep engine per prompt shard, kept across units."""

    def __init__(self, spec: str, threads: int, allow_pickle: bool, drill: dict[str, Any]) -> None:
        torch.set_num_threads(max(1, threads))
        self.adapter = load_model(spec, allow_pickle=allow_pickle)
        self.weights = weights_fingerprint(self.adapter)
        self.drill = drill
        self.key: str | None = None
        self.engines: dict[int, Any] = {}

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "weights": self.weights,
                "device": str(self.adapter.device), "threads": torch.get_num_threads()}

    def cpu_seconds(self) -> float:
        """CPU time this actor's process has used (benchmarks add it to the driver's)."""
        return time.process_time()

    def score(self, key: str, shard: int, examples: list[Example],
              batch: list[HeadId | None], shape: Batching = Batching()) -> list[list[list[float]]]:
        """One unit: per head of ``batch``, per example of the shard, the choices' log-likelihoods
        (``shape``: the driver's :func:`ganda.sweep.batching`)."""
        if self.drill.get("delay"):
            time.sleep(float(self.drill["delay"]))
        if self.drill.get("fail_head") in {str(h) for h in batch}:
            raise GandaError(f"drill: head {self.drill['fail_head']} refused")
        if key != self.key:  # another sweep: the engines of the last one are dropped
            self.key, self.engines = key, {}
        layer = None if batch[0] is None else batch[0].layer
        eng = self.engines.get(shard)
        if eng is not None and hasattr(eng, "at"):  # the layer-skipping engine only moves forward
            start = 0 if layer is None else eng.layers.index(layer)
            if eng.at > start:
                eng = None
        if eng is None:
            eng = self.engines[shard] = engine_for(self.adapter, prepare_all(self.adapter, examples), shape)
        return eng.score(layer, batch)

    def run(self, fn: Any, args: tuple[Any, ...]) -> Any:
        """One unit of another experiment: ``fn(model, *args)`` (see :meth:`RayScorer.map`)."""
        if self.drill.get("delay"):
            time.sleep(float(self.drill["delay"]))
        return fn(self.adapter, *args)


def _failure(exc: BaseException) -> str:
    """The one line a unit's exception comes down to."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    if isinstance(cause, GandaError) or not text:
        return text[-1] if text else type(cause).__name__
    typed = re.match(r"^(?:\w+\.)*(\w+): (.+)$", text[-1])  # a traceback's last line: "pkg.Error: message"
    if typed:
        return typed[2] if typed[1] == "GandaError" else f"{typed[1]}: {typed[2]}"
    return f"{type(cause).__name__}: {text[-1]}"


class _Dispatch:
    """Which units wait, which actors are idle, which refs are in flight, and which crashed actors
    are being asked whether they came back, while :meth:`RayScorer._run_units` runs a list of units.
    An actor that died is probed (``info``) until it answers, up to ``max_crashes`` failed probes in
    a row; only then does it take units again."""

    def __init__(self, pool: RayScorer, units: list[Any], submit: Any) -> None:
        self.pool, self.units, self.submit = pool, units, submit
        self.queue = deque(range(len(units)))
        self.idle = deque(range(len(pool.actors)))
        self.inflight: dict[Any, tuple[int, int]] = {}
        self.probes: dict[Any, int] = {}  # actors coming back from a crash: a unit goes to them once they answer
        self.dead: dict[int, int] = {}  # consecutive failed probes of an actor that did not come back
        self.crashes: dict[int, int] = {}  # per unit: the actors it was lost with

    def fill(self) -> None:
        """Every idle actor takes the next unit."""
        while self.queue and self.idle:
            unit, a = self.queue.popleft(), self.idle.popleft()
            self.inflight[self.submit(self.pool.actors[a], self.units[unit])] = (unit, a)

    def probe(self, a: int) -> None:
        self.probes[self.pool.actors[a].info.remote()] = a

    def answered(self, ref: Any) -> None:
        """A probe came back: the actor is idle again, still restarting (asked again shortly) or
        still dead (asked again, or given up on; with every actor given up on, the run stops)."""
        ray = _ray()
        from ray.exceptions import ActorUnavailableError, RayActorError, WorkerCrashedError

        a = self.probes.pop(ref)
        try:
            ray.get(ref)
        except ActorUnavailableError:  # restarting (reloading the model): ask again shortly
            time.sleep(0.2)
            self.probe(a)
            return
        except (RayActorError, WorkerCrashedError):
            self.dead[a] = self.dead.get(a, 0) + 1
            if self.dead[a] < self.pool.options.max_crashes:
                self.probe(a)
            elif not (self.idle or self.inflight or self.probes):
                raise GandaError(f"every Ray worker died and none came back (the last: {self.pool.spec})") from None
            return
        self.dead.pop(a, None)
        self.idle.append(a)

    def lost(self, unit: int, a: int, what: str, exc: BaseException) -> None:
        """Actor ``a`` died with ``unit``: the unit goes first in the queue, the actor is probed; a
        unit lost ``max_crashes`` times stops the run."""
        self.crashes[unit] = self.crashes.get(unit, 0) + 1
        self.pool.crashes += 1
        if self.crashes[unit] >= self.pool.options.max_crashes:
            raise GandaError(f"{what} lost its Ray worker {self.crashes[unit]} times ({_failure(exc)}); stopping") from None
        self.queue.appendleft(unit)
        self.probe(a)


class RayScorer:
    """The sweep's batch scorer on a pool of Ray actors (see the module docstring); use as
    ``with RayScorer(opts) as s, scored_by(s): run_sweep(...)``. The pool is built on first use
    for the model being swept and rebuilt when a later sweep is of another model."""

    def __init__(self, options: RayOptions | None = None) -> None:
        self.options = options or RayOptions()
        self.actors: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self.spec: str | None = None
        self.units_run = 0  # units whose results came back (for tests and benchmarks)
        self.batches_run = 0  # head batches handed back to the sweep
        self.crashes = 0  # units lost with their actor and queued again
        self.last_shards: list[tuple[int, int]] = []  # the prompt shards of the last sweep scored

    def __enter__(self) -> RayScorer:
        connect(self.options.address)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        ray = _ray()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors, self.infos, self.spec = [], [], None

    # ---- the pool

    def _resources(self) -> tuple[int, float, int]:
        ray = _ray()
        res = ray.cluster_resources()
        gpus = self.options.gpus_per_actor
        if gpus is None:
            gpus = 1.0 if res.get("GPU", 0) >= 1 else 0.0
        cpus = max(1, self.options.cpus_per_actor)
        n = self.options.actors
        if n is None:
            n = int(res.get("GPU", 0) // gpus) if gpus else int(res.get("CPU", 1) // cpus)
        if n < 1:
            raise GandaError(f"the Ray cluster has {res.get('CPU', 0):g} CPUs and {res.get('GPU', 0):g} GPUs: "
                             f"room for no actor of {cpus} CPU(s) and {gpus:g} GPU(s)")
        return max(1, n), gpus, cpus

    def _start(self, adapter: ModelAdapter) -> None:
        ray = _ray()
        self.close()
        n, gpus, cpus = self._resources()
        env = {k: os.environ[k] for k in PLACEMENT_ENV if k in os.environ}
        env["OMP_NUM_THREADS"] = str(cpus)
        cls = ray.remote(_Worker).options(num_cpus=cpus, num_gpus=gpus, max_restarts=-1, max_task_retries=0,
                                          runtime_env={"env_vars": env})
        self.spec = adapter.spec
        self.actors = [cls.remote(adapter.spec, cpus, self.options.allow_pickle, self.options.drill) for _ in range(n)]
        try:
            self.infos = ray.get([a.info.remote() for a in self.actors])
        except Exception as exc:  # noqa: BLE001 -- a worker that cannot load the model: one line, no retry
            self.close()
            raise GandaError(f"a Ray worker could not load {adapter.spec}: {_failure(exc)}") from None
        want = weights_fingerprint(adapter)
        pinned = hub.is_hub_id(adapter.spec) and hub.split(adapter.spec)[1] is not None  # the commit names the weights
        bad = [] if pinned else [i for i in self.infos if i["weights"] != want]
        if bad:
            self.close()
            raise GandaError(f"the Ray worker on {bad[0]['host']} reads other weights for {adapter.spec} "
                             f"(fingerprint {bad[0]['weights']}, here {want}): every node must see the same files")

    def cpu_seconds(self) -> float:
        """CPU time of the pool's actors so far (their processes as they run now)."""
        return float(sum(_ray().get([a.cpu_seconds.remote() for a in self.actors])))

    def pids(self) -> list[int]:
        """The actors' process ids (the fault drills kill them)."""
        return [i["pid"] for i in self.infos]

    def _ready(self, adapter: ModelAdapter, runs: str) -> None:
        """Refuse an edited layer list (it does not travel to the workers); start actors that hold ``adapter``."""
        if adapter.active_layers() != list(range(adapter.num_layers)):
            raise GandaError(f"--ray runs {runs}; a layer edit (--keep-layers, --remove-layers) does not travel to "
                             "the workers")
        if self.spec != adapter.spec or not self.actors:
            self._start(adapter)

    # ---- scoring

    def shards(self, n_examples: int, n_groups: int, align: int = 1) -> list[tuple[int, int]]:
        """Prompt shards ``(lo, hi)`` for ``n_groups`` groups of ``n_examples`` prompts: enough
        units to keep every actor busy (the pool's, or before it starts those the cluster has room
        for), whole groups where there are plenty (``RayOptions.shards`` where set); every start
        moved to the nearest multiple of ``align`` (shards left empty dropped)."""
        k = self.options.shards
        n = len(self.actors) or self._resources()[0]
        if k is None:
            k = 1 if n_groups >= 4 * n else math.ceil(4 * n / max(1, n_groups))
        k = max(1, min(k, n_examples))
        cuts = sorted({min(n_examples, align * round(round(i * n_examples / k) / align)) for i in range(k)})
        cuts = [c for c in cuts if c < n_examples] or [0]
        return [(lo, hi) for lo, hi in zip(cuts, [*cuts[1:], n_examples], strict=True)]

    def __call__(self, adapter: ModelAdapter, examples: Sequence[Example], packed: list[Prepared],
                 batches: list[list[HeadId | None]]) -> Iterator[list[list[list[float]]]]:
        """Each batch's scores, in the order of ``batches`` (as :func:`ganda.sweep.local_scores`)."""
        if not batches:
            return
        self._ready(adapter, "sweeps of the whole model")
        ray = _ray()
        # the local engine's blocks of examples (sweep._groups): a shard that starts on a block's
        # first example groups its examples as this process would, so its numbers are the same
        shape = batching(packed, batches, adapter.device.type != "cpu") if adapter.skips_layers() else Batching()
        shards = self.last_shards = self.shards(len(examples), len(batches), shape.examples)
        key = f"{adapter.spec}|{id(examples)}|{time.time_ns()}"
        refs = [ray.put(list(examples[lo:hi])) for lo, hi in shards]
        yield from self._schedule(key, batches, shards, refs, shape)

    def _schedule(self, key: str, batches: list[list[HeadId | None]], shards: list[tuple[int, int]],
                  refs: list[Any], shape: Batching = Batching()) -> Iterator[list[list[list[float]]]]:
        units = [(b, s) for b in range(len(batches)) for s in range(len(shards))]

        def submit(actor: Any, unit: tuple[int, int]) -> Any:
            return actor.score.remote(key, unit[1], refs[unit[1]], batches[unit[0]], shape)

        values = self._run_units(units, submit, lambda u: self._name(batches, shards, u))
        for batch in batches:  # a batch's shards in prompt order, joined
            got = [next(values) for _ in shards]
            yield [[ll for part in got for ll in part[h]] for h in range(len(batch))]
            self.batches_run += 1

    def _run_units(self, units: list[Any], submit: Any, name: Any) -> Iterator[Any]:
        """Run every unit on the pool (``submit(actor, unit)`` -> a Ray ref); yield their values in
        the order of ``units``, each once it and every unit before it finished. A unit lost with its
        actor is queued again; one that raises stops the run."""
        ray = _ray()
        from ray.exceptions import RayActorError, WorkerCrashedError

        d = _Dispatch(self, units, submit)
        left = len(units)
        done: dict[int, Any] = {}
        nxt = 0
        try:
            while left:
                d.fill()
                (ref,), _ = ray.wait([*d.inflight, *d.probes], num_returns=1)
                if ref in d.probes:
                    d.answered(ref)
                    continue
                unit, a = d.inflight.pop(ref)
                try:
                    val = ray.get(ref)
                except (RayActorError, WorkerCrashedError) as exc:  # the actor died with the unit: retried elsewhere
                    d.lost(unit, a, f"work unit {name(units[unit])}", exc)
                    continue
                except Exception as exc:  # noqa: BLE001 -- raised by the unit itself: deterministic, not retried
                    raise GandaError(f"work unit {name(units[unit])} failed: {_failure(exc)}") from None
                d.idle.append(a)
                self.units_run += 1
                left -= 1
                d.fill()  # actors stay busy while finished units are handed back
                done[unit] = val
                while nxt in done:
                    yield done.pop(nxt)
                    nxt += 1
        finally:
            for ref in d.inflight:  # units no result waits for any more
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=False)

    def map(self, adapter: ModelAdapter, fn: Any, units: Sequence[tuple[Any, ...]],
            names: Sequence[str] | None = None) -> Iterator[Any]:
        """``fn(model, *unit)`` for every unit, each on an actor that holds ``adapter``'s model,
        yielded in the order of ``units`` (what :func:`map_units` runs on Ray). ``fn`` is a
        module-level function every node can import; ``names`` name the units in errors."""
        if not units:
            return
        self._ready(adapter, "whole models")
        refs = [_ray().put(tuple(u)) for u in units]
        yield from self._run_units(list(range(len(units))), lambda actor, u: actor.run.remote(fn, refs[u]),
                                   lambda u: names[u] if names else f"#{u}")

    @staticmethod
    def _name(batches: list[list[HeadId | None]], shards: list[tuple[int, int]], unit: tuple[int, int]) -> str:
        batch = batches[unit[0]]
        lo, hi = shards[unit[1]]
        heads = "baseline" if batch[0] is None else f"{batch[0]}..{batch[-1]}" if len(batch) > 1 else str(batch[0])
        return f"({heads}, prompts {lo}-{hi - 1})"


@contextlib.contextmanager
def ray_sweeps(address: str | None, actors: int | None = None, *, allow_pickle: bool = False,
               **options: Any) -> Iterator[RayScorer | None]:
    """Every sweep inside this block runs on Ray (``address``: ``local`` or a cluster; None: here,
    in this process, and the block yields None): what a command's ``--ray`` option wraps its work in."""
    if address is None:
        yield None
        return
    at_least("--ray-actors", actors)
    with RayScorer(RayOptions(address=address, actors=actors, allow_pickle=allow_pickle, **options)) as scorer:
        with scored_by(scorer):
            _POOLS.append(scorer)
            try:
                yield scorer
            finally:
                _POOLS.remove(scorer)


# the pool of the innermost ray_sweeps block: where map_units runs other experiments' units
_POOLS: list[RayScorer] = []


def on_ray() -> bool:
    """Whether :func:`map_units` runs on Ray here (inside :func:`ray_sweeps`)."""
    return bool(_POOLS)


def prompt_shards(n_examples: int, n_groups: int = 1, *, align: int = 1) -> list[tuple[int, int]]:
    """How ``n_examples`` prompts split into units, for ``n_groups`` groups that run alike: one
    shard ``(0, n)`` in this process, enough for every actor inside :func:`ray_sweeps`. ``align``:
    every shard but the last starts at a multiple of it (generation keeps its local batches)."""
    if not _POOLS or n_examples < 1:
        return [(0, n_examples)]
    return _POOLS[-1].shards(n_examples, n_groups, align)


def map_units(adapter: ModelAdapter, fn: Any, units: Sequence[tuple[Any, ...]],
              names: Sequence[str] | None = None) -> Iterator[Any]:
    """``fn(adapter, *unit)`` for every unit, in order: in this process, or inside :func:`ray_sweeps`
    on its actors (each with the model loaded once, the same faults handled as a sweep's units)."""
    if _POOLS:
        yield from _POOLS[-1].map(adapter, fn, units, names)
        return
    for unit in units:
        yield fn(adapter, *unit)


__all__ = ["PLACEMENT_ENV", "RayOptions", "RayScorer", "connect", "map_units", "on_ray", "prompt_shards", "ray_sweeps"]
