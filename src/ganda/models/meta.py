"""Full-size models from a config alone, on PyTorch's ``meta`` device (shapes, no weights).

``build("meta-llama/Llama-3.1-8B")`` gives the same adapter a loaded checkpoint would get (layers,
mixers, heads, hooks) in well under a second and with no memory for weights, so head ids,
interventions and cost plans can be checked against the paper's real architectures here. The
configs of the paper's models ship in ``ganda/configs`` (``configs/SOURCES.md`` says where each
comes from); any other ``config.json`` file, model directory or hub id (config only) works too.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import GandaError, one_line
from ..finite import check_config
from ..heads import HeadId, compress_ranges
from ..registry import adapter_for, check_model_type
from . import hub
from .base import Mixer, ModelAdapter
from .loading import model_path, read_config
from .ssm.llamba import LlambaConfig, LlambaForCausalLM

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _llamba(raw: dict[str, Any]) -> nn.Module:
    return LlambaForCausalLM(LlambaConfig(**raw))


# model_type -> build from a config dict, for architectures transformers does not build.
CONFIG_BUILDERS: dict[str, Callable[[dict[str, Any]], nn.Module]] = {"llamba": _llamba}


def shipped() -> dict[str, Path]:
    """Hub id -> the shipped ``config.json`` copy (``org--name.json`` in ``ganda/configs``)."""
    return {f.stem.replace("--", "/", 1): f for f in sorted(CONFIG_DIR.glob("*.json"))}


def config_of(spec: str) -> tuple[dict[str, Any], str]:
    """The raw config of ``spec`` and where it was read: a shipped id, a ``.json`` file, a model
    directory or registered name, or a hub id (its ``config.json`` alone, through the cache)."""
    spec = str(spec)
    files = shipped()
    if spec in files:
        return read_config(files[spec]), f"shipped config {files[spec].name}"
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        return read_config(path), str(path)
    if hub.is_hub_id(spec):
        snap = hub.resolve(spec, config_only=True)
        return read_config(snap.path / "config.json"), snap.spec
    found = model_path(spec)
    if found is not None and found.is_dir() and (found / "config.json").is_file():
        return read_config(found / "config.json"), str(found)
    if found is not None:
        raise GandaError(f"{spec}: {found} has no config.json (a GGUF file is loaded whole, not on the meta device)")
    raise GandaError(f"no config for {spec!r}: give a config.json file, a model directory, a hub id or one of "
                     f"the shipped configs: {', '.join(files)}")


#: the sizes a config must state: a config without one would be built (and planned) at transformers'
#: default sizes, which describe no model (a Llama config of two keys plans as 1.07B parameters)
REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def check_sizes(raw: dict[str, Any], config: Any, model_type: str) -> None:
    """Refuse a config that leaves a size its architecture has to transformers' default."""
    aliases = getattr(type(config), "attribute_map", {}) or {}
    try:
        takes = set(inspect.signature(type(config).__init__).parameters)
    except (TypeError, ValueError):
        return
    missing = [name for name in REQUIRED_SIZES
               if (name in takes or aliases.get(name) in takes) and name not in raw and aliases.get(name) not in raw]
    if missing:
        raise GandaError(f"this {model_type} config does not state {', '.join(missing)}; ganda builds a model only "
                         "from the sizes its config gives (transformers' defaults describe no model)")


def build_model(raw: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """The model ``raw`` describes, every parameter on the ``meta`` device."""
    model_type = raw.get("model_type")
    if model_type is None and LlambaConfig.looks_like(raw):  # Llamba's published config has no model_type
        model_type = "llamba"
    if model_type not in CONFIG_BUILDERS:
        check_model_type(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):
                if model_type in CONFIG_BUILDERS:
                    model = CONFIG_BUILDERS[model_type](raw)
                else:
                    # heavy (~1 s): transformers loads when a model is built, not at start-up
                    from transformers import AutoModelForCausalLM
                    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

                    config = CONFIG_MAPPING[model_type].from_dict(raw)
                    check_sizes(raw, config, model_type)
                    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=dtype)
        except GandaError:
            raise
        except Exception as exc:  # noqa: BLE001 - a config transformers rejects: one line
            raise GandaError(f"cannot build a {model_type} model from this config: "
                             f"{one_line(exc)}") from None
    return model.to(dtype=dtype).eval()


def build(spec: str, dtype: torch.dtype = torch.bfloat16) -> ModelAdapter:
    """The adapter of ``spec``'s architecture at full size, on the meta device (no tokenizer)."""
    raw, source = config_of(spec)
    check_config(raw, source)  # a million layers would take hours to build, even without weights
    adapter = adapter_for(build_model(raw, dtype), None, str(spec))
    adapter.config_source = source  # type: ignore[attr-defined]
    return adapter


def param_count(model: nn.Module) -> int:
    """Parameters, tied ones counted once (what a model card reports)."""
    return sum(p.numel() for p in model.parameters())


def kv_head(adapter: ModelAdapter, head: HeadId) -> int | None:
    """The key/value head a query head reads under grouped-query attention (None for SSM heads)."""
    mixer = adapter.mixer_of(adapter.canonical(head))
    return head.head // mixer.kv_group if mixer.kind == "attn" else None


def kv_heads(mixer: Mixer) -> int | None:
    return mixer.num_heads // mixer.kv_group if mixer.kind == "attn" else None


def summary(adapter: ModelAdapter) -> dict[str, Any]:
    """Layers, mixers (identical ones grouped), heads and parameters, JSON-able."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for m in adapter.mixers():
        key = (m.kind, m.num_heads, m.head_dim, kv_heads(m), m.shared_key is not None)
        groups.setdefault(key, []).append(m.layer)
    mixers = [{"layers": compress_ranges(layers), "n": len(layers), "kind": kind, "num_heads": heads,
               "head_dim": dim, **({"kv_heads": kv} if kv is not None else {}), **({"shared": True} if shared else {})}
              for (kind, heads, dim, kv, shared), layers in groups.items()]
    by_kind: dict[str, int] = {}
    for m in adapter.mixers():
        by_kind[m.kind] = by_kind.get(m.kind, 0) + m.num_heads
    first = next(adapter.model.parameters())
    out: dict[str, Any] = {
        "spec": adapter.spec,
        "source": getattr(adapter, "config_source", adapter.spec),
        "family": adapter.family,
        "class": type(adapter.model).__name__,
        "n_params": param_count(adapter.model),
        "n_layers": len(adapter.original_layers()),
        "heads": sum(by_kind.values()),
        "heads_by_kind": by_kind,
        "mixers": mixers,
        "dtype": str(first.dtype).removeprefix("torch."),
        "weights_bytes": param_count(adapter.model) * first.element_size(),
        "n_ctx": adapter.n_ctx,
        "shared_blocks": adapter.shared_blocks(),
    }
    return out


def _count(n: int) -> str:
    """A parameter count as a model card writes it (8.03B, 135M, 284K)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}" if unit == "B" else f"{n / size:.0f}{unit}"
    return str(n)


def _bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def summary_text(s: dict[str, Any]) -> str:
    """The summary as a few lines for a terminal."""
    source = f" ({s['source']})" if s["source"] != s["spec"] else ""
    context = f"; context {s['n_ctx']:,} tokens" if s.get("n_ctx") else ""
    lines = [f"{s['spec']}{source}: {s['class']}, family {s['family']}",
             f"  {s['n_params']:,} parameters ({_count(s['n_params'])}; {_bytes(s['weights_bytes'])} in "
             f"{s['dtype']}), {s['n_layers']} layers, {s['heads']:,} heads "
             f"({', '.join(f'{v:,} {k}' for k, v in s['heads_by_kind'].items())}){context}"]
    for m in s["mixers"]:
        kv = f", {m['kv_heads']} KV heads" if "kv_heads" in m else ""
        shared = " (shared block invocations)" if m.get("shared") else ""
        where = f"layer {m['layers']}" if m["n"] == 1 else f"layers {m['layers']}"
        heads = f"{m['num_heads']:,} head{'s' if m['num_heads'] != 1 else ''}"
        lines.append(f"  {where}: {m['kind']}, {heads} of {m['head_dim']}{kv}{shared}")
    for key, layers in (s.get("shared_blocks") or {}).items():
        lines.append(f"  {key.replace('block', 'B')} runs at layers {compress_ranges(layers)}")
    return "\n".join(lines)
