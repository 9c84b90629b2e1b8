"""A "distilled SSM": a Mamba-2 student aligned layer by layer to a lab Llama teacher.

Like Llamba (MOHAWK without its end-to-end stage, the paper's ``Llamba-8B-untied-unaligned``):

* the student is a ``BambaForCausalLM`` with *no* attention layers: every block is a Mamba-2
  mixer followed by the teacher's MLP (Llamba keeps Llama's MLPs the same way);
* embeddings, norms, MLPs and the LM head are copied from the teacher and frozen;
* each student block ``i`` is trained, on the teacher's own hidden states, to map the teacher's
  input of block ``i`` to the teacher's output of block ``i`` (MSE, relative to the target's
  scale). Blocks are trained independently; there is **no** end-to-end stage.

So student block ``i`` and teacher block ``i`` are interchangeable, which is what makes the
paper's layer transplant (put teacher layer ``i`` into the SSM) meaningful.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

from ganda.models import load_model
from ganda.progress import tqdm

from . import checkpoint_dirs
from .train import make_batch, n_params, quick_eval, save_model
from .world import World, WorldConfig

DISTILL_DEFAULTS: dict[str, Any] = {
    # 1600 steps: lab-distilled-wd (student of lab-llama-wd, 49% intact) takes +29 points from its
    # teacher's Aggregate layer; at 800 steps (lab-distilled's count, `--steps 800`) that student is at
    # chance (33%) and no teacher layer lifts it more than 7 points (docs/lab.md, finding 6)
    "steps": 1600,
    "batch_size": 32,
    "lr": 3e-3,
    "seed": 0,
    "mamba": {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_expand": 2, "mamba_chunk_size": 16},
    "eval_every": 200,
    "eval_n": 64,
}


def build_student(teacher, mamba: dict[str, Any]):
    """A Bamba model with only Mamba-2 blocks, teacher weights copied where shapes agree."""
    tc = teacher.config
    mamba = dict(mamba)
    mamba["mamba_d_head"] = mamba.get("mamba_expand", 2) * tc.hidden_size // mamba["mamba_n_heads"]
    cfg = tf.BambaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=tc.num_hidden_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        attn_layer_indices=[],
        rms_norm_eps=tc.rms_norm_eps,
        tie_word_embeddings=tc.tie_word_embeddings,
        pad_token_id=tc.pad_token_id,
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        max_position_embeddings=tc.max_position_embeddings,
        **mamba,
    )
    student = tf.BambaForCausalLM(cfg)
    t = teacher.state_dict()
    mapping = {"model.embed_tokens.weight": "model.embed_tokens.weight", "model.final_layernorm.weight": "model.norm.weight",
               "lm_head.weight": "lm_head.weight"}
    for i in range(tc.num_hidden_layers):
        mapping[f"model.layers.{i}.input_layernorm.weight"] = f"model.layers.{i}.input_layernorm.weight"
        mapping[f"model.layers.{i}.pre_ff_layernorm.weight"] = f"model.layers.{i}.post_attention_layernorm.weight"
        for p in ("gate_proj", "up_proj", "down_proj"):
            mapping[f"model.layers.{i}.feed_forward.{p}.weight"] = f"model.layers.{i}.mlp.{p}.weight"
    sd = student.state_dict()
    with torch.no_grad():
        for s, tk in mapping.items():
            sd[s].copy_(t[tk])
    student.load_state_dict(sd)
    for name, p in student.named_parameters():
        p.requires_grad = ".mamba." in name
    return student


def distill(teacher_dir: str | Path, out: str | Path, *, steps: int | None = None, seed: int | None = None,
            progress: bool = True, log=print, **overrides: Any) -> dict[str, Any]:
    """Layer-wise hidden-state alignment of a Mamba-2 student to a lab Llama teacher."""
    cfg = {**DISTILL_DEFAULTS, **overrides}
    if steps is not None:
        cfg["steps"] = int(steps)
    if seed is not None:
        cfg["seed"] = int(seed)
    torch.set_num_threads(1)
    tdir = Path(teacher_dir)
    teacher_adapter = load_model(str(tdir), device="cpu", dtype=torch.float32)
    teacher, tok = teacher_adapter.model, teacher_adapter.tokenizer
    meta = json.loads((tdir / "lab.json").read_text()) if (tdir / "lab.json").exists() else {}
    world = World(WorldConfig.from_json(meta.get("world")))
    torch.manual_seed(cfg["seed"])
    student = build_student(teacher, cfg["mamba"])
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    ttrain = (meta.get("config") or {}).get("train", {})
    tr = {"batch_size": cfg["batch_size"],
          "mixture": ttrain.get("mixture", {"statement": 0.3, "mmlu": 0.4, "letters": 0.15, "kv": 0.15}),
          "kv_pairs": ttrain.get("kv_pairs", [2, 10]), "kv_queries": ttrain.get("kv_queries", [1, 1]),
          "n_options": ttrain.get("n_options", [4, 4]),
          # the answer weight only marks answer positions here (for the per-position diagnostic)
          "answer_weight": ttrain.get("answer_weight") or 5.0}
    layers = student.model.layers
    history: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    student.train()
    for step in tqdm(range(cfg["steps"]), desc="distill", disable=not progress):
        lr = cfg["lr"] * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(step / cfg["steps"] * 3.14159)).item()))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = make_batch(world, tok, tr, 10_000 + cfg["seed"], step)
        hs = teacher_states(teacher, batch["input_ids"], batch["attention_mask"])
        mask = batch["attention_mask"].bool()
        # positions that predict an answer token (the next token carries the answer weight): where
        # an Aggregate head acts; their alignment is reported apart, since a layer can match the
        # teacher everywhere else and still miss the one position retrieval needs
        answer = torch.zeros_like(mask)
        answer[:, :-1] = batch["weights"][:, 1:] > 1.0
        losses, answer_losses = [], []
        for i, layer in enumerate(layers):
            y = layer(hs[i].detach())
            y = y[0] if isinstance(y, tuple) else y
            target = hs[i + 1]
            sq = ((y - target) ** 2).sum(-1)
            upd = ((target - hs[i]) ** 2).sum(-1)
            scale = upd[mask].mean().clamp_min(1e-6)
            losses.append(sq[mask].mean() / scale)
            if answer.any():
                answer_losses.append(float((sq[answer].mean() / upd[answer].mean().clamp_min(1e-6)).detach()))
        loss = torch.stack(losses).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        if done % cfg["eval_every"] == 0 or done == cfg["steps"]:
            student.eval()
            acc = quick_eval(student, tok, world, cfg["eval_n"])
            student.train()
            history.append({"step": done, "layer_loss": [round(x.item(), 4) for x in losses],
                            "layer_loss_answer": [round(x, 4) for x in answer_losses],
                            "seconds": round(time.perf_counter() - t0, 1), **{k: round(v, 3) for k, v in acc.items()}})
            log(json.dumps(history[-1]))
    student.eval()
    for p in student.parameters():
        p.requires_grad = True
    # a shipped teacher is recorded by its name, not this machine's install path
    teacher = tdir.name if tdir.resolve().parent in {d.resolve() for d in checkpoint_dirs()} else str(tdir)
    record = {"config": {"arch": "distilled-mamba2", "teacher": teacher, **cfg}, "world": world.config.to_json(),
              "params": n_params(student), "steps": cfg["steps"], "seconds": round(time.perf_counter() - t0, 1),
              "history": history}
    save_model(student, tok, Path(out), record)
    return record


@torch.no_grad()
def teacher_states(teacher, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The residual stream before block 0 and after every block (before the final norm)."""
    caught: list[torch.Tensor] = []

    def grab(_m, _a, out):
        caught.append((out[0] if isinstance(out, tuple) else out).detach())

    hooks = [teacher.model.embed_tokens.register_forward_hook(grab)]
    hooks += [layer.register_forward_hook(grab) for layer in teacher.model.layers]
    try:
        teacher(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return caught
