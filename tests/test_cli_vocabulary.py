"""One command-line vocabulary: the same option names mean the same thing in every command, every
option says what it does, ``--quiet``/``-q`` and ``--allow-pickle`` are where a model loads or a
run is long, ``ganda --help`` does not wait for torch, MMLU's ``--limit`` is lm-eval's, progress
output suits a log file, and every command ends with one summary line.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer.main

from ganda import progress
from ganda.cli import app, main
from ganda.tasks import get_task
from ganda.tasks.mmlu import DATA_DIR, read_split

# commands that load a model (and so may meet pickle weights); demo and lab load aliases and lab
# checkpoints only, which are safetensors
LOADS_A_MODEL = {"eval", "attn", "heads", "sweep", "rank", "prune", "retain", "kv-curve", "mask-last-row", "roles",
                 "transplant", "extends", "sharpness", "info", "grid"}
PAIRED_BOOLEANS = {"--html", "--resume"}  # on by default: the pair says how to turn them off


def _commands() -> dict:
    """Every command as typer builds it (typer carries its own click), those built from registered
    experiments included."""
    group = typer.main.get_command(app)
    return {name: group.get_command(None, name) for name in group.list_commands(None)}  # type: ignore[arg-type]


def _options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]


def test_n_is_limit_everywhere_and_no_command_has_a_different_n():
    cmds = _commands()
    assert len(cmds) >= 20
    with_n = set()
    for name, cmd in cmds.items():
        for opt in _options(cmd):
            names = set(opt.opts) | set(opt.secondary_opts)
            assert "--n" not in names, f"{name}: --n (use -n/--limit)"
            if "-n" in names or "--limit" in names:
                assert {"-n", "--limit"} <= names and opt.name == "limit", f"{name}: {sorted(names)}"
                with_n.add(name)
    assert {"eval", "heads", "demo", "sweep", "rank", "prune", "sharpness", "lab", "plan", "extends"} <= with_n


def test_every_option_and_argument_says_what_it_does():
    missing = []
    for name, cmd in _commands().items():
        assert (cmd.help or "").strip(), f"{name} has no description"
        for p in cmd.params:
            if getattr(p, "hidden", False) or p.name == "help":
                continue
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{name} {p.name}")
    assert missing == []


def test_quiet_everywhere_allow_pickle_where_a_model_loads_and_booleans_are_flags():
    cmds = _commands()
    for name, cmd in cmds.items():
        opts = {o: p for p in _options(cmd) for o in p.opts}
        assert "--quiet" in opts and "-q" in opts, f"{name} lacks --quiet/-q"
        for p in _options(cmd):
            if p.is_flag and p.secondary_opts:
                assert p.opts[0] in PAIRED_BOOLEANS, f"{name}: {p.opts[0]}/{p.secondary_opts[0]} (a flag suffices)"
    for name in LOADS_A_MODEL:
        assert "--allow-pickle" in {o for p in _options(cmds[name]) for o in p.opts}, name
    root = typer.main.get_command(app)
    assert {"--quiet", "-q"} <= {o for p in root.params for o in p.opts}


def test_the_model_argument_names_the_lab_models_and_mmlu_limit_is_explained():
    cmds = _commands()
    for name in ("eval", "sweep", "rank", "prune", "heads", "info"):
        model = next(p for p in cmds[name].params if p.name == "model")
        assert "lab-llama-h1" in model.help and "smollm2-135m" in model.help, name
    limit = next(p for p in cmds["eval"].params if p.name == "limit")
    assert "first N questions of each subject" in limit.help and "lm-eval" in limit.help and "--sample" in limit.help


def ganda_script() -> Path:
    """The ``ganda`` console script of the interpreter running the tests: beside it in a venv, else on
    PATH (``pip install --target DIR`` puts it in ``DIR/bin``)."""
    beside = Path(sys.executable).with_name("ganda")
    found = beside if beside.exists() else shutil.which("ganda")
    assert found, "no ganda console script beside the interpreter or on PATH"
    return Path(found)


@pytest.mark.integration
def test_help_does_not_import_torch_and_answers_quickly():
    """``ganda --help`` imports neither torch nor transformers (importing them takes seconds): the
    commands import the library when they run."""
    code = "import sys, ganda.cli; print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    exe = ganda_script()
    best = float("inf")
    for _ in range(3):  # CPU seconds, which other jobs on the machine do not inflate as they do wall time
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert r.returncode == 0 and "Usage" in r.stdout and r.stderr == ""
        assert "--json" not in r.stdout and "<bool>" not in r.stdout  # flags show as flags
    assert best < 1.0, f"ganda --help used {best:.2f} s of CPU"


def test_mmlu_limit_is_the_first_n_of_each_subject_and_sample_is_explicit():
    subjects = ["anatomy", "virology"]
    got = get_task("mmlu", subjects=",".join(subjects)).examples(limit=3, seed=7)
    assert [(e.meta["subject"], e.meta["index"]) for e in got] == [(s, i) for s in subjects for i in range(3)]
    first = read_split(str(DATA_DIR), "test", "anatomy")[0]
    assert got[0].prompt.endswith(first[0].strip() + "\nA. " + first[1][0] + "\nB. " + first[1][1] + "\nC. "
                                  + first[1][2] + "\nD. " + first[1][3] + "\nAnswer:") and got[0].gold == first[2]
    whole = get_task("mmlu").examples(limit=2)
    assert len(whole) == 2 * 57  # every subject has at least two test questions
    sampled = get_task("mmlu", sample=True)
    a, b = sampled.examples(limit=40, seed=0), sampled.examples(limit=40, seed=1)
    assert len(a) == 40 and len({e.meta["subject"] for e in a}) > 10  # across subjects
    assert [e.prompt for e in a] == [e.prompt for e in sampled.examples(limit=40, seed=0)]
    assert [e.prompt for e in a] != [e.prompt for e in b]
    assert sampled.config()["sample"] is True and "sample" not in get_task("mmlu").config()


def test_sample_is_refused_for_a_task_without_subjects(capfd):
    assert main(["eval", "lab-llama-h1", "--task", "kv", "--sample", "--limit", "2"]) == 2
    assert "has no option 'sample'" in capfd.readouterr().err


def test_kv_breakdown_names_choice_positions_not_letters():
    from ganda.scoring import answers_text, by_answer, choice_labels

    kv = get_task("kv", pairs=4).examples(limit=6)
    assert choice_labels(kv) == ["#1", "#2", "#3", "#4"]
    assert choice_labels(get_task("mmlu", subjects="anatomy").examples(limit=3)) == ["A", "B", "C", "D"]
    preds = [{"gold": 0, "pred": 0, "correct": True}, {"gold": 2, "pred": 1, "correct": False}]
    assert answers_text(by_answer(preds, choice_labels(kv))) == (
        "by gold answer #1 100% #2 - #3 0%; predicted #1 50% #2 50% #3 0%")


class _Log(io.StringIO):
    """A log file: not a terminal."""

    def isatty(self) -> bool:
        return False


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_a_few_plain_lines_and_quiet_is_silent(monkeypatch):
    monkeypatch.setenv("GANDA_PROGRESS_EVERY", "0.2")
    log = _Log()
    t0 = time.perf_counter()
    for _ in progress.tqdm(range(200), desc="sweep", file=log, leave=True):
        time.sleep(0.005)  # ~1 s of work: a line per 0.2 s, not two hundred redraws
    took = time.perf_counter() - t0
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    assert 2 <= len(lines) <= took / 0.2 + 2 and len(lines) < 50, (took, lines)
    assert all(line.startswith("sweep:") for line in lines) and "200/200" in lines[-1]
    short = _Log()
    for _ in progress.tqdm(range(5), desc="quick", file=short, leave=False):
        pass
    assert short.getvalue() == ""  # a bar that ends before the first interval leaves nothing
    tty = _Terminal()
    for _ in progress.tqdm(range(3), desc="live", file=tty, mininterval=0):
        pass
    assert "\r" in tty.getvalue()  # a terminal keeps the live bar
    progress.set_quiet(True)
    try:
        quiet = _Log()
        for _ in progress.tqdm(range(50), desc="sweep", file=quiet):
            time.sleep(0.01)
        assert quiet.getvalue() == ""
    finally:
        progress.set_quiet(False)


def _ganda(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The real entry point with stderr going to a file, as in a batch job's log."""
    err = tmp_path / "stderr.log"
    with open(err, "w") as f:
        r = subprocess.run([str(ganda_script()), *args], stdout=subprocess.PIPE,
                           stderr=f, text=True, timeout=600, cwd=tmp_path,
                           env={**os.environ, "GANDA_PROGRESS_EVERY": "30"})
    r.stderr = err.read_text()
    return r


@pytest.mark.integration
@pytest.mark.parametrize("quiet", [[], ["-q"], ["--quiet"]], ids=["log", "root-q", "command-quiet"])
def test_a_run_logged_to_a_file_ends_with_one_summary_line(quiet, tmp_path):
    root, cmd = (quiet, []) if quiet == ["-q"] else ([], quiet)
    r = _ganda(*root, "sweep", "lab-llama-h1", "--task", "lab-mmlu", "-n", "8", "--out", "sw", *cmd, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and len(lines) <= 3, lines  # no carriage-return redraws in the log
    assert lines[-1].startswith("ganda sweep: done in ") and lines[-1].endswith(" s; files in sw")
    if quiet:
        assert lines == [lines[-1]]  # --quiet: the summary line only
    assert "intact acc" in r.stdout  # the results still go to stdout


def test_help_and_errors_have_no_summary_line(capfd):
    assert main(["eval", "--help"]) == 0
    assert "done in" not in capfd.readouterr().err
    assert main(["eval", "lab-llama-h1", "--limit", "0"]) == 2
    assert capfd.readouterr().err.splitlines() == ["ganda: error: --limit must be at least 1, got 0"]
    assert main(["-q", "info", "lab-llama-h1"]) == 0
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ganda info: done in ")


def test_a_long_eval_says_how_long_before_it_starts(capfd, monkeypatch):
    from ganda import plan as plan_cmd
    from ganda.models import load_model

    five = get_task("mmlu", shots=5, subjects="anatomy,virology").examples(limit=20)
    assert plan_cmd._new_chars(five) < 0.35  # the 5-shot exemplars of a subject are computed once
    assert plan_cmd._new_chars(get_task("kv", pairs=5).examples(limit=20)) > 0.6
    ad = load_model("lab-llama-h1")
    exs = get_task("lab-mmlu", adapter=ad).examples(limit=40)
    seconds = plan_cmd.announce(ad, exs)  # a tiny model: far under a minute, so nothing is said
    assert seconds is not None and 0 < seconds < 60 and capfd.readouterr().err == ""
    monkeypatch.setattr(plan_cmd, "ANNOUNCE_AFTER", 0.0)
    assert plan_cmd.announce(ad, exs) == pytest.approx(seconds)
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("this run: 40 examples, ~") and "--limit N runs fewer" in err[0]
    progress.set_quiet(True)
    try:
        plan_cmd.announce(ad, exs)
        assert capfd.readouterr().err == ""
    finally:
        progress.set_quiet(False)


def test_short_options_mean_one_thing():
    """``-n`` is --limit, ``-o`` --out, ``-t`` --task and ``-q`` --quiet wherever they appear."""
    meaning = {"-n": "limit", "-o": "out", "-t": "task", "-q": "quiet"}
    for name, cmd in _commands().items():
        opts = {o: p.name for p in _options(cmd) for o in p.opts}
        for short, long in meaning.items():
            assert opts.get(short, long) == long, f"{name}: {short} is --{opts[short]}"
        if "--out" in opts:
            assert "-o" in opts, f"{name}: --out without -o"


def test_constants_spelled_in_the_command_layer_match_the_library():
    """The commands spell a few library constants so that --help needs no torch; they must agree."""
    from ganda import models
    from ganda import plan as planner
    from ganda.commands import options, plan

    assert options.DEFAULT_MODEL == models.DEFAULT_MODEL
    assert plan.DEVICES == tuple(planner.DEVICES)
    experiment = next(p for p in _commands()["plan"].params if p.name == "experiment")
    assert set(planner.costed_experiments()) - {"attribution"} <= set(re.findall(r"[a-z]+", experiment.help))
    # rank's default rule, as rank, plan and `ganda run rank` take it
    from ganda.attribution import engine
    from ganda.experiments.builtin import RankOptions

    rule = {"method": engine.RANK_METHOD, "verify_top": engine.VERIFY_TOP, "active": engine.ACTIVE, "audit": engine.AUDIT}
    cmds = _commands()
    given = {p.name: p.default for p in cmds["rank"].params if p.name in rule}
    assert given == rule
    assert {k: getattr(RankOptions(), k) for k in rule} == rule
    # plan's flags are the experiments' options, left unset: each experiment's own default then applies
    given = {p.name: p.default for p in cmds["plan"].params if p.name in rule}
    assert given == dict.fromkeys(rule)
    # edges' rule, as edges and `ganda run edges` take it
    from ganda.experiments.circuit import EdgesOptions

    edges_rule = {"verify_top": 10, "audit": 10, "active": engine.ACTIVE_EDGES}
    assert {p.name: p.default for p in cmds["edges"].params if p.name in edges_rule} == edges_rule
    assert {k: getattr(EdgesOptions(), k) for k in edges_rule} == edges_rule


def test_experiments_read_limit_and_sample_as_eval_does():
    from ganda.experiments.common import Scorer

    assert len(Scorer(None, ["mmlu"], limit=2)._task_examples("mmlu")[1]) == 2 * 57  # lm-eval's, per subject
    sampled = Scorer(None, ["mmlu", "kv3"], limit=2, sample=True)
    assert len(sampled._task_examples("mmlu")[1]) == 2  # --sample: two in all
    assert len(sampled._task_examples("kv3")[1]) == 2  # a task without subjects is unchanged by --sample
    assert "--sample" in {o for p in _options(_commands()["prune"]) for o in p.opts}


def test_help_lists_each_command_with_its_whole_one_line_summary(capsys, monkeypatch):
    """click cuts a docstring's summary at its first period ("Cumulative layer pruning (Fig."): every
    command carries a short help that the listing shows whole, on one line of an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("Commands:\n", 1)[1].splitlines()
    shown = {}
    for line in listing:
        assert line.startswith("  ") and not line.startswith("   "), f"a summary wraps: {line!r}"
        name, summary = line.split(maxsplit=1)
        shown[name] = summary
    cmds = _commands()
    assert set(shown) == set(cmds)
    for name, cmd in cmds.items():
        assert cmd.short_help and shown[name] == cmd.short_help, name
        assert not shown[name].endswith(("...", ".", "(", "Fig")), shown[name]
        assert shown[name].count("(") == shown[name].count(")"), shown[name]


SEVERAL_TASKS = ("prune", "retain", "mask-last-row", "transplant", "extends")


def test_commands_that_score_several_tasks_take_them_as_task_and_tasks_is_hidden(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmds = _commands()
    for name, cmd in cmds.items():
        assert "--tasks" not in {o for p in _options(cmd) for o in p.opts}, f"{name} shows --tasks"
    for name in SEVERAL_TASKS:
        shown = {o: p for p in _options(cmds[name]) for o in p.opts}
        assert shown["--task"].name == "task" and shown["-t"].name == "task", name
        assert "comma-separated" in shown["--task"].help, name
        alias = next(p for p in cmds[name].params if "--tasks" in getattr(p, "opts", []))
        assert alias.hidden, name
        for spelling in ("--task", "-t", "--tasks"):  # each reaches the task check before the model loads
            argv = [name, "lab-llama-h1", spelling, "kv,nosuch", *_required(name), "--out", "unwritten"]
            assert main(argv) == 2
            assert "unknown task 'nosuch'" in capfd.readouterr().err, (name, spelling)


def _required(name: str) -> list[str]:
    return {"retain": ["--gather", "L0H0", "--aggregate", "L1H0"], "extends": ["--heads", "L0H0"],
            "transplant": ["--donor", "lab-llama-h1"]}.get(name, [])


def test_a_numbered_task_name_means_the_same_in_eval_as_in_a_task_list(capsys):
    """``kv5`` is ``kv`` with 5 pairs wherever a task is named: in ``eval --task`` as in ``prune --task``."""
    assert get_task("kv5").config() == get_task("kv", pairs=5).config()
    runs = []
    for argv in (["--task", "lab-kv4"], ["--task", "lab-kv", "--pairs", "4"]):
        assert main(["-q", "eval", "lab-llama-h1", *argv, "-n", "6", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        runs.append({k: v for k, v in got.items() if k != "seconds"})
    assert runs[0] == runs[1] and runs[0]["config"]["n_pairs"] == 4


def test_limit_is_the_cap_asked_for_and_n_the_examples_scored(capsys, tmp_path):
    assert main(["eval", "lab-llama-h1", "--task", "lab-kv", "--limit", "3", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["limit"], cfg["n"], cfg["size"]) == (3, 3, 400)  # size: the task's own, uncapped
    assert main(["eval", "lab-llama-h1", "--task", "lab-kv", "--option", "n=5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["config"]["limit"], res["config"]["n"], res["config"]["size"], res["n"]) == (None, 5, 5, 5)
    out = tmp_path / "sw"
    assert main(["run", "sweep", "lab-llama-h1", "--task", "lab-kv", "--limit", "3", "--out", str(out), "-q"]) == 0
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])["config"]
    assert (header["limit"], header["n"], header["task"]["size"]) == (3, 3, 400)


def test_ganda_run_makes_the_run_directory_ganda_name_makes(capsys, tmp_path, monkeypatch):
    """``ganda run retain`` and ``ganda retain`` write the same files (report.html included) and the
    same result.json but for the command line each records; heads' result.json records its options."""
    one, two = tmp_path / "one", tmp_path / "two"
    for argv in (["-q", "retain", "lab-llama-h1", "--gather", "L2H0", "--aggregate", "L3H0", "--task", "lab-mmlu",
                  "-n", "4", "-o", str(one)],
                 ["-q", "run", "retain", "lab-llama-h1", "--task", "lab-mmlu", "-n", "4", "--option", "gather=L2H0",
                  "--option", "aggregate=L3H0", "-o", str(two)]):
        monkeypatch.setattr(sys, "argv", ["ganda", *argv])
        assert main(argv) == 0
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir()) == [
        "report.html", "result.json", "retain.csv", "retain.png"]
    a, b = (json.loads((d / "result.json").read_text()) for d in (one, two))
    assert b["command"].startswith("ganda -q run retain lab-llama-h1") and a["command"].startswith("ganda -q retain")
    assert {k: v for k, v in a.items() if k not in ("command", "created")} == {
        k: v for k, v in b.items() if k not in ("command", "created")}
    assert main(["-q", "heads", "lab-llama-h1", "--task", "lab-mmlu", "-n", "4", "--verify-n", "4", "--top", "2",
                 "-o", str(tmp_path / "heads")]) == 0
    options = json.loads((tmp_path / "heads" / "result.json").read_text())["config"]["options"]
    assert (options["verify_n"], options["top"]) == (4, 2)


def test_quiet_silences_transformers_and_lm_eval_and_restores_them(capfd, caplog):
    import logging
    import warnings

    from transformers.utils import logging as tf_logging

    def noise() -> str:
        """What transformers and lm-eval say: stderr, log records and warnings, in one text."""
        caplog.clear()
        with warnings.catch_warnings(record=True) as warned:
            tf_logging.get_logger("transformers.modeling_utils").warning("a transformers warning")
            logging.getLogger("lm-eval").warning("an lm-eval warning")
            logging.getLogger("lm_eval.evaluator").warning("an lm_eval warning")
            warnings.warn_explicit("an lm_eval UserWarning", UserWarning, "evaluator.py", 1, module="lm_eval.evaluator")
            for _ in tf_logging.tqdm(range(3), desc="Writing model shards", mininterval=0):
                pass
        return "\n".join([capfd.readouterr().err, *caplog.messages, *(str(w.message) for w in warned)])

    assert main(["-q", "info", "lab-llama-h1"]) == 0
    verbosity, bars = tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled()
    tf_logging.set_verbosity_warning()  # a user's settings (loading a model turns transformers' down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf_logging.enable_progress_bar()
    capfd.readouterr()
    try:
        progress.set_quiet(True)
        try:
            quiet = noise()
        finally:
            progress.set_quiet(False)
        loud = noise()
    finally:
        tf_logging.set_verbosity(verbosity)
        (tf_logging.enable_progress_bar if bars else tf_logging.disable_progress_bar)()
    assert quiet.strip() == "", quiet
    for line in ("a transformers warning", "an lm-eval warning", "an lm_eval warning", "an lm_eval UserWarning",
                 "Writing model shards"):
        assert line in loud, (line, loud)


@pytest.mark.integration
def test_heads_tables_in_a_log_file_keep_every_row_on_one_line(tmp_path, monkeypatch):
    import ganda

    monkeypatch.setenv("PYTHONPATH", str(Path(ganda.__file__).parents[1]))  # the ganda under test
    r = _ganda("-q", "heads", "lab-llama-h1", "--task", "lab-kv", "-n", "2", "--verify-n", "2", "--top", "1",
               "--out", "h", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    header = [line for line in r.stdout.splitlines() if "agg peak [95% CI]" in line]
    assert header and all(c in header[0] for c in ("head", "induction", "prev-token", "sink", "final row reads", "ablated acc")), r.stdout


def test_json_printed_on_stdout_is_rounded_as_the_files_are(capsys):
    def floats(obj):
        if isinstance(obj, float):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from floats(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from floats(v)

    assert main(["-q", "eval", "lab-llama-h1", "--task", "lab-kv", "--limit", "7", "--json"]) == 0
    got = [x for x in floats(json.loads(capsys.readouterr().out)) if x not in (0.0, 1.0)]
    assert got and all(x == float(f"{x:.6g}") for x in got), got


def test_every_command_answers_help(capsys):
    """``ganda NAME --help`` for every command, the ones built from registered experiments included:
    exit 0, the usage line, and each of its options named in the text."""
    from ganda.cli import main

    for name, cmd in _commands().items():
        assert main([name, "--help"]) == 0, name
        out = capsys.readouterr().out
        assert out.startswith(f"Usage: ganda {name} "), name
        for p in _options(cmd):
            assert p.opts[0] in out, f"{name}: {p.opts[0]} missing from --help"
