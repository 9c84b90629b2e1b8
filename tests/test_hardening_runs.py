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
from typing import Any

import pytest
import torch

from ganda import runio
from ganda.cli import main
from ganda.errors import GandaError
from ganda.fingerprint import fingerprint
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


def _default_sigint() -> None:
    """A child's Ctrl-C as in a terminal, even where the suite itself runs with SIGINT ignored (a
    background job of a script: ``.ci/run &``), which every child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], env: dict[str, str] | None = None, sigint: Any = _default_sigint,
           **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ganda", *args], env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint, **kw)


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
    assert _progress(out)[0]["config"]["weights"] == fingerprint(model)


def test_weights_replaced_under_the_same_size_and_mtime_are_seen_on_resume(tmp_path, capsys):
    """``cp -p``, ``rsync -a`` and ``tar`` keep a file's size and modification time: the resume check
    reads a sample of every tensor, so another checkpoint of the same shapes is still refused."""
    from safetensors.torch import load_file, save_file

    model, out = _copy_model(tmp_path), tmp_path / "run"
    cmd = ["sweep", model, "--task", "lab-mmlu", "--limit", "4", "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    kept = _truncate_progress(out, 2)
    weights = model / "model.safetensors"
    st = weights.stat()
    tensors = load_file(weights)
    name = next(k for k in tensors if "layers.2" in k and k.endswith("o_proj.weight"))
    tensors[name] = tensors[name] * 0.5
    other = tmp_path / "other.safetensors"
    save_file(tensors, other, metadata={"format": "pt"})
    os.replace(other, weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    rc, _, err = _cli(capsys, *cmd)
    assert rc == 2 and len(_err_lines(err)) == 1, err
    assert f"the weights of {model} changed since this run started" in err
    assert (out / "progress.jsonl").read_bytes() == kept


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


def test_a_refused_resume_names_the_option_that_differs(tmp_path, capsys):
    """A rerun into a sweep's directory with another option names that option, not the whole set."""
    cmd = ["sweep", MODEL, "--task", "lab-mmlu", "--limit", "2", "--out", tmp_path / "run"]
    assert _cli(capsys, *cmd)[0] == 0
    rc, _, err = _cli(capsys, *cmd, "--batch-heads", "3")
    assert rc == 2 and "holds a different sweep (options.batch_heads differ)" in err, err


def test_a_finished_sweep_resumes_with_other_rows_printed_and_adds_its_cumulative_ablation(tmp_path, capsys):
    """--top (rows printed), --until-chance and --max-heads (a step after the heads) do not change a
    head's record: a rerun with them reuses every head and writes the cumulative ablation."""
    out = tmp_path / "run"
    cmd = ["sweep", MODEL, "--task", "lab-mmlu", "--limit", "4", "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    first = (out / "results.jsonl").read_text()
    rc, text, err = _cli(capsys, *cmd, "--top", "2", "--until-chance", "--max-heads", "2")
    assert rc == 0, err
    assert (out / "results.jsonl").read_text() == first
    assert len((out / "progress.jsonl").read_text().splitlines()) == 2 + 4  # header, baseline, four heads
    cumulative = json.loads((out / "cumulative.json").read_text())
    assert cumulative["max_heads"] == 2 and cumulative["heads_to_chance"] == 1
    assert cumulative["curve"][0]["added"] == "L3H0" and cumulative["curve"][0]["accuracy"] == 0.0  # acc 1.0 -> 0.0
    assert "top 2 of" in text


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
    fp = fingerprint(model)
    assert fp == fingerprint(model)
    cfg = model / "tokenizer_config.json"
    cfg.write_text(cfg.read_text() + " ")
    assert fingerprint(model) != fp  # a tokenizer change counts too
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    g = fingerprint(gguf)
    os.utime(gguf, ns=(1, 1))
    assert fingerprint(gguf) != g


# ---------------------------------------------------------------------------------------------
# Ctrl-C and a second writer


@pytest.mark.integration
@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_exits_130_with_one_line_and_the_rerun_resumes(tmp_path, capsys, sig, code, word):
    """Ctrl-C, and SIGTERM (a scheduler's time limit) alike: one line saying what was kept, the
    run directory released, and the same command resumes."""
    out = tmp_path / "run"
    proc = _start([*SLOW, "--out", str(out)])
    try:
        _wait_for_heads(proc, out, 1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert not (out / ".lock").exists()
    saved = _heads(out)
    assert 1 <= len(saved) < 3
    last = _err_lines(err)[-1]
    n = len(saved)
    assert last == f"ganda: {word}; {n} head{'s' if n > 1 else ''} saved, rerun the same command to resume"
    assert [line for line in _err_lines(err) if line.startswith("ganda:")] == [last]
    assert not (out / "results.jsonl").exists()

    before = (out / "progress.jsonl").read_bytes()
    rc, _, _ = _cli(capsys, *SLOW, "--out", out)
    assert rc == 0
    assert (out / "progress.jsonl").read_bytes().startswith(before)
    assert _heads(out) == ["L0H0", "L1H0", "L2H0"]
    assert (out / "results.jsonl").exists()
    assert not (out / ".lock").exists()


@pytest.mark.integration
def test_a_job_that_ignores_ctrl_c_still_stops_in_one_line_on_sigterm(tmp_path):
    """``nohup ganda sweep ... &`` starts ganda with SIGINT ignored: ganda keeps it ignored, and a
    scheduler's SIGTERM still ends the run with the one line, exit 143 and the directory released."""
    out = tmp_path / "run"
    proc = _start([*SLOW, "--out", str(out)], sigint=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_heads(proc, out, 1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # ignored
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    n = len(_heads(out))
    assert 1 <= n < 3
    assert _err_lines(err)[-1] == f"ganda: terminated; {n} head{'s' if n > 1 else ''} saved, rerun the same command to resume"
    assert not (out / ".lock").exists()


@pytest.mark.integration
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


def _python_start_up() -> float:
    """Seconds the interpreter itself takes to start here (before any ganda code can run)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import runpy"], env=ENV, check=True)
    return time.perf_counter() - t0


@pytest.mark.integration
@pytest.mark.parametrize("after", [0.0, 0.1, 0.3])
def test_ctrl_c_during_start_up_is_one_line(after):
    """Imports take most of a second; a Ctrl-C among them (once Python itself has started: before
    that no program's code runs) is ``ganda: interrupted``, exit 130, for the script and ``-m``."""
    script = Path(sys.executable).parent / "ganda"
    for argv in ([sys.executable, "-m", "ganda"], [sys.executable, "-X", "utf8", "-m", "ganda"],
                 *([[str(script)]] if script.exists() else [])):
        wait = 1.5 * _python_start_up() + 0.05 + after
        proc = subprocess.Popen([*argv, "eval", MODEL, "--task", "lab-kv", "--limit", "2"], env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_default_sigint)
        time.sleep(wait)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert proc.returncode == 130 and _err_lines(err) == ["ganda: interrupted"], (proc.returncode, err)
        assert out == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm-with-ctrl-c-ignored"])
def test_a_ctrl_c_in_an_import_is_raised_once_the_import_is_done(tmp_path, monkeypatch, sig):
    """Raised inside an import, a KeyboardInterrupt can abort torch's C++ start-up or leave a
    half-imported module: the command's handler raises it after the import instead. A SIGTERM held
    back so is raised again as SIGTERM, which a job that ignores SIGINT still receives."""
    from ganda import cli

    (tmp_path / "interrupted_module.py").write_text(
        f"import os, signal\nos.kill(os.getpid(), {int(sig)})\nsum(range(100000))\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    handlers = {signal.SIGINT: cli._ctrl_c} if sig == signal.SIGINT else \
        {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: cli._terminate}
    before = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        with pytest.raises(KeyboardInterrupt):
            import interrupted_module  # noqa: F401
            time.sleep(2)  # the interrupt comes at the first call after the import
        assert sys.getprofile() is None
        assert cli._run.get("signal") == (signal.SIGTERM if sig == signal.SIGTERM else None)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        sys.setprofile(None)
        cli._run.clear()
    assert sys.modules.pop("interrupted_module").DONE is True


def test_an_interrupt_a_library_turns_into_an_error_is_an_interrupt(monkeypatch, capsys):
    """A Ctrl-C inside an import that a library swallows surfaces as that library's error (the
    half-imported module 'most likely due to a circular import'): the command reports the interrupt."""
    import ganda
    from ganda.models import loading

    def swallowing(*_args, **_kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except BaseException:  # noqa: BLE001 - the library's catch-all
            pass
        raise GandaError("lab-llama-h1: its config.json is not a valid config: cannot import name 'x'")

    monkeypatch.setattr(loading, "load_tokenizer", swallowing)
    before = signal.signal(signal.SIGINT, ganda._interrupted_at_startup)  # as when run as the command
    try:
        rc = main(["eval", MODEL, "--task", "lab-kv", "--limit", "2"])
    finally:
        signal.signal(signal.SIGINT, before)
    assert rc == 130
    assert _err_lines(capsys.readouterr().err) == ["ganda: interrupted"]


@pytest.mark.integration
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


@pytest.mark.integration
def test_lock_is_reentrant_in_process_and_exclusive_across_processes(tmp_path):
    d = tmp_path / "run"
    with runio.run_dir_lock(d), runio.run_dir_lock(d):
        code = f"from ganda import runio\nrunio.acquire_run_dir({str(d)!r})"
        p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
        assert p.returncode != 0 and f"another ganda run is writing to {d} (pid {os.getpid()})" in p.stderr
    assert not d.exists()  # created for a run that wrote nothing: removed again


@pytest.mark.integration
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
    ["prune", "--task", "lab-mmlu"],
    ["heads", "--task", "lab-mmlu"],
    ["extends", "--heads", "L0H0", "--task", "lab-mmlu"],
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


@pytest.mark.integration
def test_failed_write_leaves_no_partial_file(tmp_path):
    dest = tmp_path / "preds"
    dest.mkdir()
    p = subprocess.run([sys.executable, "-m", "ganda", "eval", MODEL, "--task", "lab-mmlu", "--limit", "60", "--json",
                        "--predictions", str(dest / "p.jsonl")], env=ENV, capture_output=True, text=True,
                       preexec_fn=_fsize_limit(2048))
    assert p.returncode == 2 and p.stdout == ""
    assert _err_lines(p.stderr) == [f"ganda: error: could not write {dest / 'p.jsonl'}: File too large"]
    assert list(dest.iterdir()) == []


@pytest.mark.integration
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


# ---------------------------------------------------------------------------------------------
# ganda grid reuses a job only when it was made as the spec says now


def _grid(tmp_path: Path, model: Path | str, experiment: str = "sweep", **options) -> Path:
    import yaml

    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({"models": [str(model)], "tasks": ["lab-mmlu"], "experiments": [experiment],
                                    "out": str(tmp_path / "grid"), "options": {"limit": 2, "seed": 0, **options}}))
    return spec


def test_grid_reuses_a_job_only_when_its_record_matches(tmp_path, capsys, monkeypatch):
    """A rerun with another limit or seed, on replaced weights or in another dtype refuses in one line
    and leaves every file as it was; the same spec again skips the finished job without loading."""
    import ganda.grid

    model = _copy_model(tmp_path)
    spec = _grid(tmp_path, model)
    assert _cli(capsys, "grid", spec)[0] == 0
    grid = tmp_path / "grid"
    job = next(grid.glob("*/lab-mmlu/sweep"))
    record = json.loads((job / "grid-job.json").read_text())
    assert record["options"]["limit"] == 2 and record["weights"] == fingerprint(model)
    files = {p: p.read_bytes() for p in grid.rglob("*") if p.is_file() and p.name != ".lock"}

    def refused(*extra: str, **env: str) -> str:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rc, out, err = _cli(capsys, "grid", *extra)
        for k in env:
            monkeypatch.delenv(k)
        assert rc == 2 and len(_err_lines(err)) == 1 and "Traceback" not in err, err
        assert {p: p.read_bytes() for p in grid.rglob("*") if p.is_file() and p.name != ".lock"} == files
        return err

    assert "made with other options.limit than the spec gives now" in refused(_grid(tmp_path, model, limit=3))
    assert "other options.seed" in refused(_grid(tmp_path, model, seed=1))
    assert "other options.sweep" in refused(_grid(tmp_path, model, sweep={"batch_heads": 1}))
    assert "other dtype" in refused(_grid(tmp_path, model), GANDA_DTYPE="bfloat16")
    from safetensors.torch import load_file, save_file

    weights = model / "model.safetensors"
    st, blob = weights.stat(), weights.read_bytes()
    tensors = load_file(weights)
    tensors["model.layers.2.self_attn.o_proj.weight"] *= 0.5  # another checkpoint, same size and mtime
    save_file(tensors, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    err = refused(_grid(tmp_path, model))
    assert "other weights than the spec gives now; the weights changed since" in err
    weights.write_bytes(blob)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(ganda.grid, "load_model", lambda *a, **k: pytest.fail("a finished job loaded its model"))
    rc, out, _ = _cli(capsys, "grid", _grid(tmp_path, model))
    assert rc == 0 and out.startswith(" done") and (grid / "grid.json").exists()


def test_a_grid_job_reruns_from_its_journal_when_only_options_its_units_ignore_changed(tmp_path, capsys, monkeypatch):
    """sweep's top, until_chance and max_heads (journal=False) do not refuse a finished job: it runs
    again from its journal (no head swept again), adds the cumulative ablation and records the new
    options; the same spec once more skips it without loading the model."""
    import ganda.grid

    model = _copy_model(tmp_path)
    assert _cli(capsys, "grid", _grid(tmp_path, model))[0] == 0
    job = next((tmp_path / "grid").glob("*/lab-mmlu/sweep"))
    first = (job / "results.jsonl").read_text()
    assert not (job / "cumulative.json").exists()
    later = {"top": 2, "until_chance": True, "max_heads": 2}
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, sweep=later))
    assert rc == 0, err
    assert (job / "results.jsonl").read_text() == first
    assert json.loads((job / "cumulative.json").read_text())["max_heads"] == 2
    assert json.loads((job / "grid-job.json").read_text())["options"]["sweep"] == later
    monkeypatch.setattr(ganda.grid, "load_model", lambda *a, **k: pytest.fail("a finished job loaded its model"))
    assert _cli(capsys, "grid", _grid(tmp_path, model, sweep=later))[0] == 0
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, sweep={**later, "batch_heads": 1}))
    assert rc == 2 and "made with other options.sweep than the spec gives now" in err


@pytest.mark.parametrize("experiment, kept", [("sweep", "results.jsonl"), ("rank", "ranking.json")])
def test_a_grid_job_without_its_result_json_finishes_from_its_journal(tmp_path, capsys, monkeypatch, experiment, kept):
    """result.json says a sweep or rank job finished; a job directory of the format before it (its
    results.jsonl or ranking.json alone) runs again from its journals, measuring no head again, and
    gains its result.json."""
    import ganda.grid
    import ganda.sweep

    model = _copy_model(tmp_path)
    assert _cli(capsys, "grid", _grid(tmp_path, model, experiment))[0] == 0
    job = next((tmp_path / "grid").glob(f"*/lab-mmlu/{experiment}"))
    first, summary = (job / kept).read_text(), json.loads((job / "result.json").read_text())["summary"]
    (job / "result.json").unlink()
    monkeypatch.setattr(ganda.sweep, "sweep_record", lambda *a, **k: pytest.fail("a journalled head was swept again"))
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, experiment))
    assert rc == 0, err
    if experiment == "sweep":
        assert (job / kept).read_text() == first
    else:  # the same ranking, timed anew
        assert json.loads((job / kept).read_text())["ranking"] == json.loads(first)["ranking"]
    assert json.loads((job / "result.json").read_text())["summary"] == summary
    monkeypatch.setattr(ganda.grid, "load_model", lambda *a, **k: pytest.fail("a finished job loaded its model"))
    assert _cli(capsys, "grid", _grid(tmp_path, model, experiment))[0] == 0


def test_a_grid_edges_job_redraws_from_its_journal_with_other_show_and_roles(tmp_path, capsys):
    """edges' show (edges drawn) and roles (labels) change no exact check: the finished job runs
    again, drawing one edge with unlabelled heads; another verify_top is refused."""
    model = _copy_model(tmp_path)
    assert _cli(capsys, "grid", _grid(tmp_path, model, "edges", edges={"verify_top": 3}))[0] == 0
    job = next((tmp_path / "grid").glob("*/lab-mmlu/edges"))
    first = json.loads((job / "result.json").read_text())
    assert first["config"]["show"] == 10 and len(first["roles"]) == 4
    later = {"verify_top": 3, "show": 1, "roles": False}
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, "edges", edges=later))
    assert rc == 0, err
    again = json.loads((job / "result.json").read_text())
    assert again["config"]["show"] == 1 and again["roles"] == {} and again["rows"] == first["rows"]
    assert json.loads((job / "grid-job.json").read_text())["options"]["edges"] == later
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, "edges", edges={**later, "verify_top": 2}))
    assert rc == 2 and "made with other options.edges than the spec gives now" in err


def test_grid_refuses_a_job_directory_without_its_record(tmp_path, capsys):
    model = _copy_model(tmp_path)
    assert _cli(capsys, "grid", _grid(tmp_path, model))[0] == 0
    job = next((tmp_path / "grid").glob("*/lab-mmlu/sweep"))
    (job / "grid-job.json").unlink()  # results made elsewhere, or by hand: nothing says how
    rc, _, err = _cli(capsys, "grid", _grid(tmp_path, model, limit=3))
    assert rc == 2 and "holds results but no grid-job.json saying how they were made" in err


# ---------------------------------------------------------------------------------------------
# output files: inputs never, ganda's own again, anything else with --force


def test_an_output_ganda_wrote_is_replaced_and_another_file_only_with_force(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pred, page = tmp_path / "pred.jsonl", tmp_path / "page.html"
    eval_cmd = ["eval", MODEL, "--task", "lab-kv", "--limit", "2"]
    assert _cli(capsys, *eval_cmd, "--predictions", pred)[0] == 0
    assert _cli(capsys, *eval_cmd, "--predictions", pred)[0] == 0  # its own file: replaced
    figure = tmp_path / "maps.png"
    attn = ["attn", MODEL, "--heads", "L1H0", "--prompt", "the key is", "--out", figure]
    assert _cli(capsys, *attn)[0] == 0 and _cli(capsys, *attn)[0] == 0
    assert (tmp_path / "maps.json").exists()
    run = tmp_path / "run"
    assert _cli(capsys, "sweep", MODEL, "--task", "lab-kv", "--limit", "2", "--heads", "L0H0", "--out", run)[0] == 0
    for _ in range(2):
        assert _cli(capsys, "report", run, "--out", page)[0] == 0
    assert _cli(capsys, "report", run, "--out", run / "report.html")[0] == 0  # a new page beside the results

    mine = b"keep me\n"
    for path, cmd in ((pred, [*eval_cmd, "--predictions", pred]), (figure, attn),
                      (tmp_path / "maps.json", attn), (page, ["report", run, "--out", page])):
        path.write_bytes(mine)
        rc, _, err = _cli(capsys, *cmd)
        assert rc == 2 and "that ganda wrote; pass --force to replace it" in err and path.read_bytes() == mine
        assert _cli(capsys, *cmd, "--force")[0] == 0 and path.read_bytes() != mine
    rc, _, err = _cli(capsys, "report", run, "--out", run / "results.jsonl", "--force")
    assert rc == 2 and "ganda never writes over its inputs" in err


def test_attention_drawn_to_a_device_writes_nothing_beside_it(tmp_path, capsys):
    stray = [Path("/dev/null.png"), Path("/dev/null.json")]
    for p in stray:  # left by an earlier run: matplotlib appended .png to a bare /dev/null
        if p.is_file():
            p.unlink()
    rc, out, _ = _cli(capsys, "attn", MODEL, "--heads", "L1H0", "--prompt", "the key is", "--out", "/dev/null")
    assert rc == 0 and out.strip() == "wrote /dev/null"
    assert not any(p.exists() for p in stray)


def test_quiet_silences_the_gguf_dequantisation_bar(tmp_path, monkeypatch, capfd):
    from test_hardening_models import write_tiny_gguf

    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GANDA_PROGRESS_EVERY", "0")
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    capfd.readouterr()
    assert main(["-q", "eval", str(gguf), "--task", "kv", "--pairs", "2", "--limit", "1", "--json"]) == 0
    err = capfd.readouterr().err
    assert "GGUF" not in err and _err_lines(err) == [line for line in _err_lines(err) if line.startswith("ganda eval")]
    monkeypatch.setenv("GANDA_CACHE", str(tmp_path / "cache2"))  # not quiet: the bar is ganda's (a log line here)
    assert main(["eval", str(gguf), "--task", "kv", "--pairs", "2", "--limit", "1", "--json"]) == 0
    assert "de-quantizing GGUF" in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# a damaged progress file is named, line and all, never resumed from


@pytest.mark.parametrize("line, why", [
    (b"5", "line 4: a JSON int, not a record"),
    (b"[]", "line 4: a JSON list, not a record"),
    (b"garbage", "line 4: not JSON"),
    (b'{"type": "head", "head": "L2H0"}', "line 4: a head record without layer, index, n, acc"),
    (b'{"type": "header", "config": {}}', "line 4: a record of type 'header'"),
    (b'{"type": "head", "head": "L2H0", "layer": 2, "index": 0, "n": 2, "acc": 0.5, "acc_norm": 0.5, "pred": [0, 1], '
     b'"pred_norm": [0, 1], "gold": [0, 1], "loglik": [[NaN, -1.0], [-1.0, -2.0]]}',
     "line 4: a head record whose scores are malformed or not finite"),
])
def test_a_damaged_progress_line_is_reported_with_its_number(tmp_path, capsys, line, why):
    out = tmp_path / "run"
    cmd = ["sweep", MODEL, "--task", "lab-kv", "--limit", "2", "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    lines = (out / "progress.jsonl").read_bytes().splitlines(keepends=True)
    damaged = b"".join([*lines[:3], line + b"\n", *lines[3:4]])
    (out / "progress.jsonl").write_bytes(damaged)
    (out / "results.jsonl").unlink()
    rc, _, err = _cli(capsys, *cmd)
    assert rc == 2 and len(_err_lines(err)) == 1 and "Traceback" not in err, err
    assert f"progress.jsonl, line {why.split(':')[0].split()[1]}: {why.split(': ', 1)[1]}" in err
    assert err.rstrip().endswith("use --no-resume to start over, or another --out")
    assert (out / "progress.jsonl").read_bytes() == damaged  # nothing cut, nothing appended
    assert _cli(capsys, *cmd, "--no-resume")[0] == 0


def test_a_torn_last_line_still_resumes(tmp_path, capsys):
    """A write killed before its newline leaves a torn last line: it is cut off and the run resumes."""
    out = tmp_path / "run"
    cmd = ["sweep", MODEL, "--task", "lab-kv", "--limit", "2", "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    full = (out / "progress.jsonl").read_bytes()
    lines = full.splitlines(keepends=True)
    (out / "progress.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:25])
    (out / "results.jsonl").unlink()
    assert _cli(capsys, *cmd)[0] == 0
    assert _heads(out) == ["L0H0", "L1H0", "L2H0", "L3H0"]


def test_a_damaged_verification_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "rank"
    cmd = ["rank", MODEL, "--task", "lab-kv", "--limit", "2", "--ablation", "mean", "--verify-top", "2", "--active", "0", "--audit", "0",
           "--out", out]
    assert _cli(capsys, *cmd)[0] == 0
    for name, line in (("verify/progress.jsonl", b'{"type": "head"}'), ("attribution.jsonl", b"7")):
        f = out / name
        kept = f.read_bytes()
        f.write_bytes(kept + line + b"\n")
        rc, _, err = _cli(capsys, *cmd)
        assert rc == 2 and len(_err_lines(err)) == 1 and "Traceback" not in err and f"{name}, line " in err, err
        f.write_bytes(kept)


def test_grid_draws_the_prompts_ganda_sweep_draws():
    """A grid job takes the task options ``ganda sweep`` takes (the runner's TaskInputs), mmlu's
    seeded ``sample`` among them: the same questions as ``--sample -n 2 --seed 3``, not the first
    question of each subject."""
    from ganda.experiments.runner import RunInputs
    from ganda.grid import job_inputs, task_options
    from ganda.tasks import get_task

    opts = {"limit": 2, "seed": 3, "sample": True, "shots": 0, "sweep": {"heads": "L0H0"}}
    job = job_inputs({"model": "m", "task": "mmlu", "experiment": "sweep"}, opts)
    grid = get_task("mmlu", **job.task_options()).examples(limit=job.limit, seed=job.seed)
    cli = get_task("mmlu", **RunInputs(task="mmlu", sample=True, shots=0).task_options()).examples(limit=2, seed=3)
    first = get_task("mmlu", shots=0).examples(limit=2, seed=3)
    assert [e.prompt for e in grid] == [e.prompt for e in cli] != [e.prompt for e in first]
    assert task_options({**opts, "sample": False}) == {"shots": 0}  # mmlu's default, as the command line passes it


@pytest.mark.parametrize("experiment, n", [("heads", 16), ("sweep", 32), ("rank", 32)])
def test_a_grid_job_without_a_limit_takes_its_experiments_default(experiment, n):
    """A spec without ``limit`` (or with null) gives each job the prompts ``ganda NAME`` takes without
    ``--limit``: ``heads`` scores 16, not the 32 of the others, and the job's record says so."""
    from ganda.grid import job_inputs, job_record

    job = {"model": "m", "task": "mmlu", "experiment": experiment}
    for opts in ({}, {"limit": None}):
        assert job_inputs(job, opts).limit == n and job_record(job, opts, None, "float32")["options"]["limit"] == n
    assert job_inputs(job, {"limit": 5}).limit == 5


def test_a_grid_job_is_the_run_ganda_name_makes(tmp_path, capsys):
    """A grid job runs through the runner ``ganda NAME`` runs through: an alias names its experiment
    (``attribution`` is ``rank``), a null limit is rank's default 32, the job's files record its options
    as ``ganda rank`` records them, and what ``ganda heads`` refuses before its model loads the grid
    refuses before any job runs, writing nothing."""
    import yaml

    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({"models": [MODEL], "tasks": ["lab-mmlu"], "experiments": ["attribution"],
                                    "out": str(tmp_path / "grid"), "options": {"limit": None, "attribution":
                                                                              {"verify_top": 2}}}))
    assert _cli(capsys, "grid", spec)[0] == 0
    job = tmp_path / "grid" / MODEL / "lab-mmlu" / "rank"
    direct = tmp_path / "direct"
    assert _cli(capsys, "rank", MODEL, "--task", "lab-mmlu", "--verify-top", "2", "--limit", "32", "--out", direct)[0] == 0
    grid, cli = (json.loads((d / "ranking.json").read_text()) for d in (job, direct))
    assert grid["n"] == 32 and grid["config"]["options"]["verify_top"] == 2
    assert grid["config"] == cli["config"] and grid["ranking"] == cli["ranking"]
    spec.write_text(yaml.safe_dump({"models": [MODEL], "tasks": ["lab-mmlu", "lab-knowledge"], "experiments": ["heads"],
                                    "out": str(tmp_path / "grid2"), "options": {"limit": 2}}))
    rc, _, err = _cli(capsys, "grid", spec)
    assert rc == 2 and _err_lines(err) == ["ganda: error: task 'lab-knowledge' has no segments to score heads on"], err
    assert not list((tmp_path / "grid2").rglob("*.json"))


