"""A *deep* lab Transformer: a trained lab Llama grown by block expansion, for finding 2.

Every lab model puts its Aggregate step in its last layer, so cutting any layer from the end
costs retrieval at once: the lab had no analogue of the paper's Llama-3.1-8B, whose MMLU score
survives the loss of 14 of its 32 layers while its knowledge score falls. What those upper layers
hold in the paper is knowledge MMLU does not need. This module builds exactly that:

* the base model's blocks, embeddings and final norm are kept and **frozen**;
* ``layers`` new blocks go **on top**, each a copy of the base's last block whose output
  projections (attention ``o_proj``, MLP ``down_proj``) start at zero, so the grown model
  computes exactly the base model until training moves them (LLaMA Pro's block expansion,
  Wu et al. 2024, with the new blocks stacked rather than interleaved);
* only the new blocks train, on the base world plus facts of *unasked* relations
  (``UNASKED_RELATIONS``): stated, in the knowledge task, never asked in MMLU format.

So the grown model's first ``n`` layers *are* the base model, weight for weight: pruning it back
to them leaves MMLU-format accuracy where the base had it, while the knowledge task (which also
asks the unasked facts) loses what the new blocks stored. That is the paper's Fig. 2 by
construction of the training, not of the measurement: ``ganda prune`` still has to find where
MMLU breaks, and remove-and-restore and head retention run on the minimal model it finds.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from ganda.errors import GandaError
from ganda.interventions import truncate
from ganda.models import adapter_for, load_model
from ganda.progress import tqdm

from . import checkpoint_dirs
from .tokenizer import build_tokenizer
from .train import (
    _lr,
    eval_examples,
    lm_loss_parts,
    make_batch,
    n_params,
    quick_accuracy,
    quick_eval,
    save_model,
)
from .world import World, WorldConfig

GROW_DEFAULTS: dict[str, Any] = {
    "layers": 2,
    # two unasked relations beside the two asked ones: the minimal model (the base) then knows a
    # third of what the knowledge task asks, about the paper's "30% of the knowledge score
    # suffices for MMLU" (docs/lab.md, finding 2)
    "unasked": ["pet", "key"],
    "steps": 2500,
    "batch_size": 48,
    "lr": 5e-3,
    "min_lr_frac": 0.1,
    "warmup": 100,
    "weight_decay": 0.1,
    # mostly statements (where the new facts are); MMLU-format and letters questions so that the
    # new blocks learn to carry the base's answers through unchanged
    "mixture": {"statement": 0.7, "mmlu": 0.2, "letters": 0.1},
    "seed": 0,
    "eval_every": 500,
    "eval_n": 64,
}


def expand_blocks(base, layers: int):
    """A copy of the Llama ``base`` with ``layers`` new blocks on top, each its last block with
    zeroed output projections (identity at the start), every base parameter frozen."""
    if getattr(base.config, "model_type", None) != "llama":
        raise GandaError(f"block expansion needs a Llama model, not {getattr(base.config, 'model_type', '?')!r}")
    if layers < 1:
        raise GandaError("grow at least one layer")
    cfg = copy.deepcopy(base.config)
    n0 = cfg.num_hidden_layers
    cfg.num_hidden_layers = n0 + layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:n0] + [cfg.layer_types[n0 - 1]] * layers
    grown = type(base)(cfg)
    missing, unexpected = grown.load_state_dict(base.state_dict(), strict=False)
    new = tuple(f"model.layers.{i}." for i in range(n0, n0 + layers))
    if unexpected or [k for k in missing if not k.startswith(new)]:
        raise GandaError(f"block expansion: weights that do not match: {unexpected or missing}")
    grown.tie_weights()
    last = base.model.layers[n0 - 1].state_dict()
    with torch.no_grad():
        for i in range(n0, n0 + layers):
            block = grown.model.layers[i]
            block.load_state_dict(last)
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
    for p in grown.parameters():
        p.requires_grad = False
    for i in range(n0, n0 + layers):
        for p in grown.model.layers[i].parameters():
            p.requires_grad = True
    return grown


def exit_accuracy(model, tok, world: World, depth: int, n: int, seed: int = 1) -> dict[str, float]:
    """Knowledge (asked / unasked facts) and MMLU-format accuracy reading out after ``depth``
    blocks: the pruned model ``ganda prune`` scores, cut by the same intervention."""
    with truncate(depth).apply(adapter_for(model, tok, "grown")):
        out = {"knowledge_asked": quick_accuracy(model, tok, eval_examples(world, "knowledge", n, seed, split="asked")),
               "mmlu": quick_accuracy(model, tok, eval_examples(world, "mmlu", n, seed))}
        if world.config.unasked_relations:
            out["knowledge_unasked"] = quick_accuracy(model, tok, eval_examples(world, "knowledge", n, seed,
                                                                                split="unasked"))
    return out


def grow(base_dir: str | Path, out: str | Path, *, layers: int | None = None, steps: int | None = None,
         seed: int | None = None, progress: bool = True, log=print, **overrides: Any) -> dict[str, Any]:
    """Grow the lab Llama in ``base_dir`` by block expansion and train the new blocks on the base
    world plus the unasked relations' facts; writes a model directory to ``out``."""
    cfg = {**GROW_DEFAULTS, **overrides}
    for k, v in (("layers", layers), ("steps", steps), ("seed", seed)):
        if v is not None:
            cfg[k] = int(v)
    torch.set_num_threads(1)
    bdir = Path(base_dir)
    base_ad = load_model(str(bdir), device="cpu", dtype=torch.float32)
    meta = json.loads((bdir / "lab.json").read_text()) if (bdir / "lab.json").exists() else {}
    if "world" not in meta:
        raise GandaError(f"{bdir} is not a lab model (no lab.json with its world)")
    base_world = WorldConfig.from_json(meta["world"])
    world = World(WorldConfig(**{**base_world.__dict__, "unasked_relations": tuple(cfg["unasked"])}))
    tok = build_tokenizer(world)
    if tok.get_vocab() != base_ad.tokenizer.get_vocab():
        raise GandaError("the grown world's vocabulary differs from the base model's")
    torch.manual_seed(cfg["seed"])
    model = expand_blocks(base_ad.model, cfg["layers"])
    n0 = base_ad.model.config.num_hidden_layers
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"], betas=(0.9, 0.98))
    btrain = (meta.get("config") or {}).get("train", {})
    tr = {"batch_size": cfg["batch_size"], "mixture": cfg["mixture"], "kv_pairs": btrain.get("kv_pairs", [2, 10]),
          "n_options": btrain.get("n_options", [4, 4]), "answer_weight": btrain.get("answer_weight"),
          "lr": cfg["lr"], "warmup": cfg["warmup"], "min_lr_frac": cfg["min_lr_frac"], "steps": cfg["steps"],
          "schedule": "cosine"}
    history: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    model.train()
    for step in tqdm(range(cfg["steps"]), desc="grow", disable=not progress):
        for g in opt.param_groups:
            g["lr"] = _lr(step, tr)
        batch = make_batch(world, tok, tr, 20_000 + cfg["seed"], step)
        opt.zero_grad(set_to_none=True)
        total, weight = lm_loss_parts(model, batch)
        loss = total / weight
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        if done % cfg["eval_every"] == 0 or done == cfg["steps"]:
            model.eval()
            row = {"step": done, "loss": round(loss.item(), 4), "seconds": round(time.perf_counter() - t0, 1),
                   **{k: round(v, 3) for k, v in quick_eval(model, tok, world, cfg["eval_n"]).items()}}
            for depth in (n0, n0 + cfg["layers"]):
                row[f"exit{depth}"] = {k: round(v, 3) for k, v in exit_accuracy(model, tok, world, depth,
                                                                                 cfg["eval_n"]).items()}
            model.train()
            history.append(row)
            log(json.dumps(row))
    model.eval()
    for p in model.parameters():
        p.requires_grad = True
    base = bdir.name if bdir.resolve().parent in {d.resolve() for d in checkpoint_dirs()} else str(bdir)
    # ``train``: what the new blocks trained on (make_batch's keys; the base's run is in its own lab.json)
    record = {"config": {"arch": "grown-llama", "base": base, "base_layers": n0, **cfg,
                         "train": {**tr, "weight_decay": cfg["weight_decay"], "seed": 20_000 + cfg["seed"]}},
              "world": world.config.to_json(), "params": n_params(model), "steps": cfg["steps"],
              "seconds": round(time.perf_counter() - t0, 1), "history": history}
    save_model(model, tok, Path(out), record)
    return record
