"""Where a model's layers live: one device, or an accelerate device map with CPU and disk offload.

``--device-map auto`` (or ``GANDA_DEVICE_MAP=auto``) lets accelerate spread a model that does not
fit one device over the GPUs, then CPU memory, then disk; an explicit map (inline JSON or a
``.json`` file: ``{"model.embed_tokens": 0, "model.layers.0": 0, ..., "model.layers.31": "disk"}``)
places each module. Offloaded weights are fetched to the execution device by accelerate's hooks
during each module's forward, so ganda's interventions (hooks on the output projection's input)
and maps (captured activations) see the same tensors as with the model in memory; the SSM map
code reads parameters outside a forward through :func:`weights_on`. Disk-offloaded weights read
from the checkpoint's own safetensors files where possible, else from ``--offload-folder``
(``GANDA_OFFLOAD_FOLDER``, default ``$GANDA_CACHE/offload``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..device import parse_device, parse_dtype
from ..errors import GandaError

DEVICE_MAP_ENV = "GANDA_DEVICE_MAP"
OFFLOAD_ENV = "GANDA_OFFLOAD_FOLDER"
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

DeviceMap = str | dict[str, str | int]


@dataclass(frozen=True)
class Placement:
    """An accelerate device map (a strategy name or module -> device) and the disk offload folder."""

    device_map: DeviceMap
    offload_folder: Path

    def load_kwargs(self) -> dict[str, Any]:
        """What ``from_pretrained`` takes to load straight into this placement."""
        return {"device_map": self.device_map, "offload_folder": str(self.offload_folder)}


def _device_value(module: str, value: Any, source: str) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise GandaError(f"{source}: {module!r} -> {value!r} is not a device (cpu, disk, 0, cuda:1, mps)")
    if isinstance(value, int):
        parse_device(f"cuda:{value}", f"{source} ({module})")
    elif value not in ("cpu", "disk"):
        parse_device(value, f"{source} ({module})")
    return value


def parse_device_map(text: str | dict[str, Any], source: str = "--device-map") -> DeviceMap:
    """``auto``/``balanced``/``sequential``, a JSON object, or a ``.json`` file holding one."""
    if isinstance(text, dict):
        raw: Any = text
    else:
        text = str(text).strip()
        if text in STRATEGIES:
            return text
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise GandaError(f"{source}: not valid JSON ({exc.msg} at character {exc.pos})") from None
        elif text.endswith(".json"):
            try:
                raw = json.loads(Path(text).expanduser().read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise GandaError(f"{source}: cannot read {text} ({str(exc).splitlines()[0]})") from None
        else:
            raise GandaError(f"{source}={text!r}: expected {', '.join(STRATEGIES)}, a JSON object or a .json file")
    if not isinstance(raw, dict) or not raw:
        raise GandaError(f"{source}: a device map is a non-empty JSON object of module -> device")
    return {str(k): _device_value(str(k), v, source) for k, v in raw.items()}


def cache_dir() -> Path:
    """ganda's cache (``$GANDA_CACHE``, default ``~/.cache/ganda``): dequantised GGUFs and disk offload."""
    return Path(os.environ.get("GANDA_CACHE", Path.home() / ".cache" / "ganda"))


def resolve(device_map: DeviceMap | None = None, offload_folder: str | Path | None = None) -> Placement | None:
    """The placement asked for by arguments or ``GANDA_DEVICE_MAP``/``GANDA_OFFLOAD_FOLDER`` (None:
    the whole model on one device, the default)."""
    source = "device_map"
    if device_map is None and os.environ.get(DEVICE_MAP_ENV):
        device_map, source = os.environ[DEVICE_MAP_ENV], DEVICE_MAP_ENV
    if device_map is None:
        if offload_folder is not None:
            raise GandaError("--offload-folder needs --device-map (a map that puts some modules on disk)")
        return None
    parsed = parse_device_map(device_map, source)
    folder = offload_folder or os.environ.get(OFFLOAD_ENV) or cache_dir() / "offload"
    return Placement(parsed, Path(folder).expanduser())


def dispatch(model: nn.Module, place: Placement, dtype: torch.dtype) -> nn.Module:
    """Place a model that was loaded whole (GGUF, Llamba) according to ``place``."""
    # accelerate takes ~1 s to import; only placed models need it
    from accelerate import dispatch_model, infer_auto_device_map

    model = model.to(dtype=dtype)
    device_map = place.device_map
    if isinstance(device_map, str):
        device_map = infer_auto_device_map(model, dtype=dtype)
    names = {n for n, _ in model.named_modules()}
    unknown = sorted(k for k in device_map if k and k not in names)
    if unknown:
        raise GandaError(f"device map: no module {unknown[0]!r} in {type(model).__name__}")
    if any(v == "disk" for v in device_map.values()):
        place.offload_folder.mkdir(parents=True, exist_ok=True)
    return dispatch_model(model, device_map=device_map, offload_dir=str(place.offload_folder))


def check(model: nn.Module) -> None:
    """Refuse a placement whose input embeddings are on disk: inputs go where they are."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None)
    if weight is not None and weight.device.type == "meta":
        raise GandaError("device map: the input embeddings are offloaded to disk; keep them on a device "
                         "(inputs are sent where they live)")


def has_hooks(module: nn.Module) -> bool:
    return any(hasattr(m, "_hf_hook") for m in module.modules())


@contextlib.contextmanager
def weights_on(module: nn.Module) -> Iterator[None]:
    """Make an offloaded module's parameters real tensors for the duration (a no-op otherwise)."""
    if not has_hooks(module):
        yield
        return
    # only reached for models placed with accelerate, which is then already imported
    from accelerate.utils import align_module_device

    with contextlib.ExitStack() as stack:  # accelerate hooks each submodule: fetch every one's tensors
        for sub in module.modules():
            stack.enter_context(align_module_device(sub))
        yield


_SAVED_ENV: dict[str, str | None] = {}  # environment variables set for one command, with their old values


def apply_command_options(dtype: str | None = None, device_map: str | None = None, offload_folder: str | None = None) -> None:
    """The command line's ``--dtype``/``--device-map``/``--offload-folder``: set ``GANDA_DTYPE``,
    ``GANDA_DEVICE_MAP`` and ``GANDA_OFFLOAD_FOLDER`` for this command (validated first), so that
    every model the command loads follows them; :func:`restore_command_options` restores the old values."""
    if dtype is not None:
        parse_dtype(dtype, "--dtype")
    if device_map is not None:
        parse_device_map(device_map, "--device-map")
    for name, value in (("GANDA_DTYPE", dtype), (DEVICE_MAP_ENV, device_map), (OFFLOAD_ENV, offload_folder)):
        if value is not None:
            _SAVED_ENV.setdefault(name, os.environ.get(name))
            os.environ[name] = value


def restore_command_options() -> None:
    for name, old in _SAVED_ENV.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    _SAVED_ENV.clear()
