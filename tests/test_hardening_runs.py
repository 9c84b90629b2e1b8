"""Runs that write results: resumes check the weights, Ctrl-C exits 130, one writer per run
directory, output paths checked before the model loads, atomic result files."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ganda import runio
from ganda.cli import main
from ganda.errors import GandaError
from ganda_lab import CHECKPOINTS

MODEL = "lab-llama-h1"  # four layers of one head: a full sweep is four heads
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONDONTWRITEBYTECODE": "1"}
# A sweep slow enough to be interrupted between heads (the reference loop scores every prompt per head).
SLOW = ["sweep", MODEL, "--task", "lab-mmlu", "--limit", "120", "--naive", "--heads", "L0H0,L1H0,L2H0"]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _err_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def _progress(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]


def _heads(out: Path) -> list[str]:
    return [r["head"] for r in _progress(out) if r["type"] == "head"]


def _start(args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ganda", *args], env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _wait_for_heads(proc: subprocess.Popen, out: Path, n: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (out / "progress.jsonl").exists() and len(_heads(out)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the sweep ended or stalled before {n} heads (rc {proc.poll()})")


def _copy_model(tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(CHECKPOINTS / MODEL, dst)
    return dst


def _truncate_progress(out: Path, heads: int) -> bytes:
    """Keep the header, the baseline and the first ``heads`` heads: what a run killed there leaves."""
    lines = (out / "progress.jsonl").read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[: 2 + heads])
    (out / "progress.jsonl").write_bytes(kept)
    (out / "results.jsonl").unlink()
    return kept


# ---------------------------------------------------------------------------------------------
# resume checks the weights


def test_resume_after_weights_changed_is_refused(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    model, out = _copy_model(tmp_path), tmp_path / "run"
    cmd = ["sweep", model, "--task", "lab-mmlu", "--limit", "12", "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    full = _progress(out)
    assert len(full) == 2 + 4

    # unchanged weights: the rerun resumes and computes only the missing heads
    kept = _truncate_progress(out, 2)
    assert _cli(capsys, *cmd)[0] == 0
    after = (out / "progress.jsonl").read_bytes()
    assert after.startswith(kept)
    assert _heads(out) == ["L0H0", "L1H0", "L2H0", "L3H0"]  # each head once, none recomputed
    for a, b in zip(_progress(out)[1:], full[1:], strict=True):
        assert a["pred"] == b["pred"]
        assert sum(a["loglik"], []) == pytest.approx(sum(b["loglik"], []), abs=1e-4)

    # one weight changed in place, same shapes and file size: refused, nothing appended
    kept = _truncate_progress(out, 2)
    weights = model / "model.safetensors"
    tensors = load_file(weights)
    name = next(k for k in tensors if "layers.3" in k and k.endswith("o_proj.weight"))
    tensors[name] = tensors[name] * 0.5
    save_file(tensors, weights, metadata={"format": "pt"})
    rc, _, err = _cli(capsys, *cmd)
    assert rc == 2
    lines = _err_lines(err)
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"ganda: error: the weights of {model} changed since this run started (fingerprint ")
    assert lines[0].endswith("use --no-resume or another --out")
    assert (out / "progress.jsonl").read_bytes() == kept
    assert not (out / "results.jsonl").exists()

    # --no-resume starts over on the new weights
    assert _cli(capsys, *cmd, "--no-resume")[0] == 0
    assert _heads(out) == ["L0H0", "L1H0", "L2H0", "L3H0"]
    assert _progress(out)[0]["config"]["weights"] == runio.model_fingerprint(model)


def test_resume_with_another_dtype_is_refused(tmp_path):
    from ganda.models import load_model
    from ganda.sweep import run_sweep
    from ganda.tasks import get_task

    model, out = _copy_model(tmp_path), tmp_path / "run"
    ad = load_model(str(model), device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=ad).examples(limit=4, seed=0)
    run_sweep(ad, exs, heads=ad.heads()[:2], out_dir=out, progress=False)
    _truncate_progress(out, 1)
    bf16 = load_model(str(model), device="cpu", dtype=torch.bfloat16)
    with pytest.raises(GandaError, match=r"holds a different sweep \(dtype differ\)"):
        run_sweep(bf16, exs, heads=bf16.heads()[:2], out_dir=out, progress=False)


def test_resume_of_a_model_changed_in_memory_is_refused(tmp_path):
    from test_sweep import tiny_adapter, tiny_examples

    from ganda.sweep import run_sweep

    ad, exs = tiny_adapter(), tiny_examples()[:2]
    run_sweep(ad, exs, heads=ad.heads()[:3], out_dir=tmp_path, progress=False)
    _truncate_progress(tmp_path, 1)
    with torch.no_grad():
        ad.model.model.layers[2].self_attn.o_proj.weight.mul_(0.5)
    with pytest.raises(GandaError, match="the weights of tiny-llama changed since this run started"):
        run_sweep(ad, exs, heads=ad.heads()[:3], out_dir=tmp_path, progress=False)


def test_fingerprint_follows_the_files(tmp_path):
    model = _copy_model(tmp_path)
    fp = runio.model_fingerprint(model)
    assert fp == runio.model_fingerprint(model)
    cfg = model / "tokenizer_config.json"
    cfg.write_text(cfg.read_text() + " ")
    assert runio.model_fingerprint(model) != fp  # a tokenizer change counts too
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    g = runio.model_fingerprint(gguf)
    os.utime(gguf, ns=(1, 1))
    assert runio.model_fingerprint(gguf) != g


# ---------------------------------------------------------------------------------------------
# Ctrl-C and a second writer


def test_ctrl_c_exits_130_with_one_line_and_the_rerun_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _start([*SLOW, "--out", str(out)])
    try:
        _wait_for_heads(proc, out, 1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    saved = _heads(out)
    assert 1 <= len(saved) < 3
    last = _err_lines(err)[-1]
    n = len(saved)
    assert last == f"ganda: interrupted; {n} head{'s' if n > 1 else ''} saved, rerun the same command to resume"
    assert [line for line in _err_lines(err) if line.startswith("ganda:")] == [last]
    assert not (out / "results.jsonl").exists()

    before = (out / "progress.jsonl").read_bytes()
    rc, _, _ = _cli(capsys, *SLOW, "--out", out)
    assert rc == 0
    assert (out / "progress.jsonl").read_bytes().startswith(before)
    assert _heads(out) == ["L0H0", "L1H0", "L2H0"]
    assert (out / "results.jsonl").exists()
    assert not (out / ".lock").exists()


@pytest.mark.usefixtures("lab_checkpoints")
def test_ctrl_c_during_eval_exits_130():
    # stderr is a pipe, so progress comes as log lines; GANDA_PROGRESS_EVERY=0 writes every update
    proc = _start(["eval", "lab-llama", "--task", "lab-mmlu", "--limit", "2000"],
                  env={**ENV, "GANDA_PROGRESS_EVERY": "0"})
    try:
        deadline = time.time() + 300
        seen = ""
        while time.time() < deadline and "%|" not in seen:  # the progress bar: evaluation is under way
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk.decode(errors="replace")
        assert proc.poll() is None, seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in seen + err
    assert (seen + err).endswith("ganda: interrupted\n") and (seen + err).count("ganda:") == 1
    assert out == ""


def test_second_run_into_the_same_out_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    proc = _start([*SLOW, "--out", str(out)])
    try:
        _wait_for_heads(proc, out, 1)
        t0 = time.perf_counter()
        rc, stdout, err = _cli(capsys, *SLOW, "--out", out)
        took = time.perf_counter() - t0
        assert proc.poll() is None, "the first sweep ended before the second started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 2 and stdout == ""
    assert _err_lines(err) == [f"ganda: error: another ganda run is writing to {out} (pid {proc.pid}); "
                               "wait for it to finish or choose another --out"]
    assert took < 10  # refused before loading the model or scoring anything
    heads = _heads(out)
    assert len(heads) == len(set(heads))
    # the killed run's lock died with it: the directory can be claimed again
    with runio.run_dir_lock(out) as d:
        assert (d / ".lock").read_text().strip() == str(os.getpid())
    assert not (out / ".lock").exists()


def test_lock_is_reentrant_in_process_and_exclusive_across_processes(tmp_path):
    d = tmp_path / "run"
    with runio.run_dir_lock(d), runio.run_dir_lock(d):
        code = f"from ganda import runio\nrunio.acquire_run_dir({str(d)!r})"
        p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
        assert p.returncode != 0 and f"another ganda run is writing to {d} (pid {os.getpid()})" in p.stderr
    assert not d.exists()  # created for a run that wrote nothing: removed again


def test_temp_files_of_a_killed_writer_are_cleared(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    code = (f"from ganda import runio\nimport os\nwith runio.atomic_open({str(d / 'results.jsonl')!r}) as f:\n"
            "    f.write('half')\n    f.flush()\n    os._exit(9)")
    assert subprocess.run([sys.executable, "-c", code], env=ENV).returncode == 9
    left = [p.name for p in d.iterdir()]
    assert len(left) == 1 and left[0].startswith(".results.jsonl.")  # the killed writer's temporary file
    (d / "notes.txt").write_text("mine")
    with runio.run_dir_lock(d):
        assert sorted(p.name for p in d.iterdir()) == [".lock", "notes.txt"]
    assert [p.name for p in d.iterdir()] == ["notes.txt"]


# ---------------------------------------------------------------------------------------------
# output paths checked first, results written atomically


def test_predictions_directory_is_refused_before_the_model_loads(tmp_path, capsys):
    rc, out, err = _cli(capsys, "eval", tmp_path / "no-such-model", "--task", "lab-mmlu", "--predictions", tmp_path)
    assert rc == 2 and out == ""
    assert _err_lines(err) == [f"ganda: error: --predictions {tmp_path} is a directory; give a file name"]


@pytest.mark.parametrize("command", [
    ["sweep", "--task", "lab-mmlu"],
    ["prune", "--tasks", "lab-mmlu"],
    ["heads", "--task", "lab-mmlu"],
    ["extends", "--heads", "L0H0", "--tasks", "lab-mmlu"],
    ["rank", "--task", "lab-mmlu"],
])
def test_out_under_a_file_is_refused_before_the_model_loads(tmp_path, capsys, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    missing = tmp_path / "no-such-model"
    rc, out, err = _cli(capsys, command[0], missing, *command[1:], "--out", blocker / "sub")
    assert rc == 2 and out == ""
    assert _err_lines(err) == [f"ganda: error: --out {blocker / 'sub'}: {blocker} is not a directory"]


def test_unwritable_out_is_refused_before_the_model_loads(tmp_path, capsys):
    rc, _, err = _cli(capsys, "sweep", tmp_path / "no-such-model", "--task", "lab-mmlu", "--out", "/proc/ganda-run")
    assert rc == 2
    assert _err_lines(err)[0].startswith("ganda: error: --out /proc/ganda-run: cannot write in /proc")
    rc, _, err = _cli(capsys, "attn", tmp_path / "no-such-model", "--heads", "L0H0", "--out", "/proc/a.png")
    assert rc == 2 and "cannot write in /proc" in err
    assert not (tmp_path / "no-such-model").exists()


def test_failed_run_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "runs" / "sweep"
    rc, _, err = _cli(capsys, "sweep", tmp_path / "no-such-model", "--task", "lab-mmlu", "--out", out)
    assert rc == 2 and "no such model" in err
    assert list(tmp_path.iterdir()) == []  # neither the run directory nor its new parent is left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_is_one_line(capsys):
    rc, out, err = _cli(capsys, "eval", MODEL, "--task", "lab-mmlu", "--limit", "3", "--json",
                        "--predictions", "/dev/full")
    assert rc == 2 and out == ""
    assert _err_lines(err) == ["ganda: error: could not write /dev/full: No space left on device"]


def _fsize_limit(n: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))

    return limit


def test_failed_write_leaves_no_partial_file(tmp_path):
    dest = tmp_path / "preds"
    dest.mkdir()
    p = subprocess.run([sys.executable, "-m", "ganda", "eval", MODEL, "--task", "lab-mmlu", "--limit", "60", "--json",
                        "--predictions", str(dest / "p.jsonl")], env=ENV, capture_output=True, text=True,
                       preexec_fn=_fsize_limit(2048))
    assert p.returncode == 2 and p.stdout == ""
    assert _err_lines(p.stderr) == [f"ganda: error: could not write {dest / 'p.jsonl'}: File too large"]
    assert list(dest.iterdir()) == []


def test_sweep_stopped_by_a_full_disk_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = ["sweep", MODEL, "--task", "lab-mmlu", "--limit", "12", "--out", str(out)]
    p = subprocess.run([sys.executable, "-m", "ganda", *cmd], env=ENV, capture_output=True, text=True,
                       preexec_fn=_fsize_limit(5000))
    assert p.returncode == 2, p.stderr
    lines = _err_lines(p.stderr)
    assert lines[-1] == f"ganda: error: could not write {out / 'progress.jsonl'}: File too large"
    assert "Traceback" not in p.stderr
    complete = []
    for line in (out / "progress.jsonl").read_text().splitlines():  # the last line may be cut short
        try:
            complete.append(json.loads(line))
        except json.JSONDecodeError:
            break
    assert complete[0]["type"] == "header" and len([r for r in complete if r["type"] == "head"]) < 4
    assert _cli(capsys, *cmd)[0] == 0
    assert _heads(out) == ["L0H0", "L1H0", "L2H0", "L3H0"]


def test_atomic_open_keeps_the_old_file_on_error(tmp_path):
    path = tmp_path / "result.json"
    runio.write_text(path, "old")
    with pytest.raises(RuntimeError), runio.atomic_open(path) as f:
        f.write("new, half")
        raise RuntimeError("stopped mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
    runio.write_text(path, "new")
    assert path.read_text() == "new"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~runio._UMASK)


def test_report_out_is_checked_before_rendering(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"kind": "x", "model": "m", "summary": {}}))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, _, err = _cli(capsys, "report", run, "--out", blocker / "r.html")
    assert rc == 2
    assert _err_lines(err) == [f"ganda: error: --out {blocker / 'r.html'}: {blocker} is not a directory"]
    rc, _, _ = _cli(capsys, "report", run, "--out", tmp_path / "new" / "r.html")
    assert rc == 0 and (tmp_path / "new" / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["r.html"]


def test_new_sweep_clears_an_earlier_sweeps_results(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["sweep", MODEL, "--task", "lab-mmlu", "--out", out]
    assert _cli(capsys, *base, "--limit", "12", "--until-chance", "--max-heads", "2")[0] == 0
    assert (out / "cumulative.json").exists()
    assert _cli(capsys, *base, "--limit", "8", "--no-resume")[0] == 0
    # the report would otherwise show the old cumulative curve beside the new sweep
    assert not any((out / f"cumulative.{ext}").exists() for ext in ("json", "csv", "png"))
    assert json.loads((out / "results.jsonl").read_text().splitlines()[0])["config"]["n"] == 8
