"""Sweeps, extends and prune on Ray (a local instance, 2 CPUs) write the files of a local run: untouched, with a
worker SIGKILLed mid-unit, after a driver restart; a unit that fails deterministically stops the run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import require_module

from ganda import cli, sweep
from ganda.attribution import rank_heads
from ganda.distributed import RayOptions, RayScorer
from ganda.errors import GandaError
from ganda.grid import parse_spec, run_grid
from ganda.models import load_model
from ganda.prepared import prepare_all
from ganda.sweep import load_result, run_sweep, scored_by
from ganda.tasks import get_task, task_for_model

try:
    import ray
except ImportError:  # said in one line by the ray_local fixture
    ray = None
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread", "ray_local", "lab_checkpoints")]

MODEL, TASK, N, BATCH = "lab-llama", "lab-mmlu", 6, 2  # 3 layers x 4 heads: 6 batches + the baseline


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (2 CPUs) for the module: start-up is the slow part."""
    require_module("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def lab():
    adapter = load_model(MODEL, device="cpu")
    task = task_for_model(TASK, get_task(TASK), adapter)
    return adapter, task.examples(limit=N, seed=0)


@pytest.fixture(scope="module", autouse=True)
def blocks_of_four(lab):
    """Examples run four to a forward (``sweep.batching``), here and on the actors: a
    prompt shard must then start on a block's first example (0 or 4 of 6) to number as the local run."""
    widths = [len(p.tokens) for p in prepare_all(lab[0], lab[1])]
    with pytest.MonkeyPatch.context() as mp:  # the environment: a driver run as a subprocess reads it too
        mp.setenv("GANDA_FORWARD_TOKENS", str(math.ceil(4 * BATCH * sum(widths) / len(widths))))
        assert sweep.batching(prepare_all(lab[0], lab[1]), [[None], [1, 2]]).examples == 4
        yield


@pytest.fixture(scope="module")
def local(lab, tmp_path_factory):
    """The reference: the same sweep in this process."""
    out = tmp_path_factory.mktemp("local")
    res = run_sweep(lab[0], lab[1], out_dir=out, batch_heads=BATCH, progress=False, config={"seed": 0})
    return out, res


def _ray_sweep(lab, out, scorer, **kw):
    with scored_by(scorer):
        return run_sweep(lab[0], lab[1], out_dir=out, batch_heads=BATCH, progress=False, config={"seed": 0}, **kw)


def _same_files(a: Path, b: Path) -> None:
    for name in ("progress.jsonl", "results.jsonl", "results.csv"):
        assert (a / name).read_text() == (b / name).read_text(), name


def _close(res, ref, tol=1e-4) -> None:
    assert [r["head"] for r in res.records] == [r["head"] for r in ref.records]
    assert [r["pred"] for r in res.records] == [r["pred"] for r in ref.records]
    worst = max(abs(x - y) for r, q in zip(res.records + [res.baseline], ref.records + [ref.baseline], strict=True)
                for lr, lq in zip(r["loglik"], q["loglik"], strict=True) for x, y in zip(lr, lq, strict=True))
    assert worst <= tol


def test_ray_sweep_equals_the_local_run(lab, local, tmp_path):
    with RayScorer(RayOptions(actors=2, shards=2)) as scorer:
        res = _ray_sweep(lab, tmp_path, scorer)
        assert len(set(scorer.pids())) == 2 and all(i["threads"] == 1 for i in scorer.infos)
        assert scorer.units_run == 7 * 2 and scorer.crashes == 0  # (baseline + 6 batches) x 2 prompt shards
        assert scorer.last_shards == [(0, 4), (4, 6)]  # 2 shards asked for, (0, 3) and (3, 6), moved to a block
    _close(res, local[1])
    _same_files(tmp_path, local[0])
    assert load_result(tmp_path).records == local[1].records


def test_a_worker_killed_mid_unit_is_retried_elsewhere(lab, local, tmp_path):
    killed: list[int] = []
    with RayScorer(RayOptions(actors=2, shards=1, drill={"delay": 0.4})) as scorer:
        def kill_one(rec):
            if not killed:  # units are in flight on both actors: each sleeps 0.4 s before scoring
                killed.append(scorer.pids()[0])
                os.kill(killed[0], signal.SIGKILL)
        res = _ray_sweep(lab, tmp_path, scorer, on_head=kill_one)
        assert killed and scorer.crashes == 1  # the unit in flight on the killed actor, retried once elsewhere
    _close(res, local[1])
    _same_files(tmp_path, local[0])


def test_a_restarted_driver_recomputes_nothing_finished(lab, local, tmp_path):
    class DriverDied(Exception):
        pass

    def die(rec):
        if rec["head"] == "L1H0":
            raise DriverDied

    with RayScorer(RayOptions(actors=2, shards=1)) as scorer:
        with pytest.raises(DriverDied):
            _ray_sweep(lab, tmp_path, scorer, on_head=die)
    lines = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    saved = [x["head"] for x in lines if x["type"] == "head"]
    assert saved == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]
    with RayScorer(RayOptions(actors=2, shards=1)) as scorer:
        res = _ray_sweep(lab, tmp_path, scorer)
        assert scorer.units_run == 4  # L1H0's batch (L1H1 unsaved), L1H2's and layer 2's two; no baseline
    _close(res, local[1])
    _same_files(tmp_path, local[0])


def test_a_deterministic_failure_stops_the_run_with_one_line(lab, tmp_path):
    with RayScorer(RayOptions(actors=2, shards=1, drill={"fail_head": "L1H2"})) as scorer:
        with pytest.raises(GandaError, match=r"^work unit \(L1H2\.\.L1H3, prompts 0-5\) failed: drill: head L1H2 "
                                             r"refused$") as err:
            _ray_sweep(lab, tmp_path, scorer)
        assert scorer.crashes == 0 and scorer.units_run <= 6  # never retried
    assert "\n" not in str(err.value)
    lines = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    saved = [x["head"] for x in lines if x["type"] == "head"]
    assert saved == [str(h) for h in lab[0].heads()][: len(saved)] and len(saved) <= 6  # in order, none past L1H1
    assert not (tmp_path / "results.csv").exists()


def test_grid_runs_models_tasks_experiments_and_resumes(lab, local, tmp_path, capsys):
    spec = {"models": [MODEL], "tasks": [TASK], "experiments": ["sweep", "rank"], "out": str(tmp_path / "grid"),
            "options": {"limit": N, "seed": 0, "sweep": {"batch_heads": BATCH},
                        "rank": {"method": "atp", "verify_top": 3, "audit": 1, "active": 0}}}
    spec_file = tmp_path / "grid.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    assert cli.main(["grid", str(spec_file), "--ray", "local", "--ray-actors", "2"]) == 0
    grid = json.loads((tmp_path / "grid" / "grid.json").read_text())
    assert [(j["experiment"], j["status"]) for j in grid["jobs"]] == [("sweep", "done"), ("rank", "done")]
    job = tmp_path / "grid" / MODEL / TASK
    assert load_result(job / "sweep").records == local[1].records
    ranking = json.loads((job / "rank" / "ranking.json").read_text())["ranking"]
    exact = {r["head"]: r["exact"] for r in ranking if r["exact"] is not None}
    ref = rank_heads(lab[0], lab[1], method="atp", verify_top=3, audit=1, active=0, seed=0, progress=False)  # in this process
    assert len(exact) == 4 and exact.keys() == ref.exact.keys()
    assert all(abs(exact[h] - ref.exact[h]) <= 1e-4 for h in exact)
    assert [r["head"] for r in ranking] == [r["head"] for r in ref.ranking()]
    capsys.readouterr()
    again = run_grid(spec)  # everything finished: skipped, headlines kept, no model loaded
    assert [j["result"] for j in again] == [j["result"] for j in grid["jobs"]]


@pytest.mark.parametrize(("change", "message"), [
    ({"experiments": ["prunes"]}, "grid spec: experiment 'prunes' is not one of edges, heads, path, rank, sweep"),
    ({"options": {"limt": 3}}, "grid spec: unknown option 'limt' (expected limit, sample, pairs, shots, subjects, "
                               "seed or an experiment name)"),
    ({"options": {"sweep": {"method": "atp"}}}, "grid spec: options.sweep: unknown option 'method' (takes heads, "
                                                 "batch_heads, naive, metric, ablation, top, until_chance, max_heads)"),
    ({"models": []}, "grid spec: 'models' must be a non-empty list of names"),
    ({"outdir": "x"}, "grid spec: unknown key 'outdir' (expected models, tasks, experiments, options, out)"),
])
def test_grid_spec_errors_are_one_line(change, message):
    spec = {"models": [MODEL], "tasks": [TASK], "experiments": ["sweep"], **change}
    with pytest.raises(GandaError) as err:
        parse_spec(spec)
    assert str(err.value) == message


def test_cli_driver_killed_and_restarted_resumes(local, tmp_path):
    """A ``ganda sweep --ray ADDRESS`` driver (joined to this module's Ray instance) SIGKILLed
    mid-run, then run again: it finishes from its files, and they equal a local run's."""
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "ganda", "sweep", MODEL, "--task", TASK, "--limit", str(N), "--batch-heads",
           str(BATCH), "--out", str(out), "--ray", ray.get_runtime_context().gcs_address, "--ray-actors", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GANDA_RAY_DRILL": json.dumps({"delay": 0.3})}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = out / "progress.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if progress.exists() and progress.read_text().count('"type": "head"') >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = progress.read_text().count('"type": "head"')
    assert 3 <= saved < 12
    env.pop("GANDA_RAY_DRILL")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_result(out).records == local[1].records
    assert (out / "results.csv").read_text() == (local[0] / "results.csv").read_text()


def test_a_model_the_workers_cannot_load_stops_before_any_unit(tiny, lab, tmp_path):
    """``tiny`` is built in memory: its spec names nothing a worker can load."""
    with RayScorer(RayOptions(actors=1)) as scorer, scored_by(scorer):
        with pytest.raises(GandaError) as err:
            run_sweep(tiny, lab[1][:1], out_dir=tmp_path, progress=False)
    assert str(err.value).startswith("a Ray worker could not load tiny-llama: no such model: 'tiny-llama'")
    assert "\n" not in str(err.value) and scorer.units_run == 0


# ---- ganda extends and ganda prune: task shards and pruning-curve shards on the same pool

HEADS, EXT_TASKS = "L0H0,L2H1", ["lab-mmlu", "lab-kv"]  # each has heads within noise beside it


def _same_rows(got: list[dict], want: list[dict], skip: tuple[str, ...] = ("seconds",), tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key in g.keys() - set(skip):
            if isinstance(w[key], float):
                assert abs(g[key] - w[key]) <= tol, key
            else:
                assert g[key] == w[key], key


@pytest.fixture(scope="module")
def extends_local(lab, tmp_path_factory):
    from ganda.experiments.extends import run_extends

    out = tmp_path_factory.mktemp("extends-local")
    return out, run_extends(lab[0], HEADS, EXT_TASKS, limit=N, out=out, progress=False)


def _same_extends(out: Path, ref: Path) -> None:
    got, want = (json.loads((d / "extends.json").read_text()) for d in (out, ref))
    _same_rows(got.pop("results"), want.pop("results"))
    assert got == want
    names = sorted(p.name for p in (ref / "predictions").iterdir())
    assert names == sorted(p.name for p in (out / "predictions").iterdir()) and len(names) == 6
    for name in names:
        rows = [[json.loads(x) for x in (d / "predictions" / name).read_text().splitlines()] for d in (out, ref)]
        assert [{**r, "loglik": None} for r in rows[0]] == [{**r, "loglik": None} for r in rows[1]]
        assert all(abs(x - y) <= 1e-4 for a, b in zip(*rows, strict=True)
                   for x, y in zip(a["loglik"], b["loglik"], strict=True))


def test_extends_on_ray_equals_the_local_run(extends_local, tmp_path, capsys):
    out = tmp_path / "ray"
    args = ["extends", MODEL, "--heads", HEADS, "--tasks", ",".join(EXT_TASKS), "--limit", str(N), "--out", str(out)]
    assert cli.main([*args, "--ray", "local", "--ray-actors", "2"]) == 0
    _same_extends(out, extends_local[0])
    assert "wrote" in capsys.readouterr().out


def test_extends_worker_killed_mid_unit_is_retried(lab, extends_local, tmp_path):
    import threading

    from ganda.distributed import ray_sweeps
    from ganda.experiments.extends import run_extends

    killed: list[int] = []
    with ray_sweeps("local", 2, drill={"delay": 0.4}) as pool:
        def kill_one() -> None:  # once a unit is back, units are in flight on both actors (0.4 s each)
            deadline = time.time() + 120
            while pool.units_run < 1 and time.time() < deadline:
                time.sleep(0.01)
            killed.append(pool.pids()[0])
            os.kill(killed[0], signal.SIGKILL)

        killer = threading.Thread(target=kill_one)
        killer.start()
        run_extends(lab[0], HEADS, EXT_TASKS, limit=N, out=tmp_path, progress=False)
        killer.join()
        assert killed and pool.crashes == 1 and pool.units_run == 2 * 3 * 2  # tasks x conditions x prompt shards
    _same_extends(tmp_path, extends_local[0])


def test_a_failing_extends_unit_stops_with_one_line(lab):
    from ganda.distributed import map_units, ray_sweeps
    from ganda.experiments import extends

    with ray_sweeps("local", 1) as pool, pytest.raises(GandaError) as err:
        list(map_units(lab[0], extends._unit, [(extends._shard, ("nosuch", {}, [], N, 0, 0, None, False))],
                       ["(nosuch, intact)"]))
    assert str(err.value).startswith("work unit (nosuch, intact) failed: unknown task 'nosuch'")
    assert "\n" not in str(err.value) and pool.crashes == 0


def test_prune_and_remove_restore_on_ray_equal_the_local_run(lab):
    from ganda.distributed import ray_sweeps
    from ganda.experiments.common import Scorer
    from ganda.experiments.prune import prune_curve, remove_restore

    def run() -> list[dict]:
        scorer = Scorer(lab[0], [TASK, "lab-kv"], limit=N, progress=False)
        curve = prune_curve(lab[0], scorer, drop_task=TASK)
        slow = remove_restore(lab[0], scorer, 2, drop_task=TASK, fast_path=False)  # full forwards: a unit a condition
        return [curve.to_json(), remove_restore(lab[0], scorer, 2, drop_task=TASK).to_json(), slow.to_json()]

    want = run()
    with ray_sweeps("local", 2) as pool:
        got = run()
        # (curve + remove-restore) x tasks x prompt shards (8 wanted, 1 a prompt), + 3 conditions of the slow one
        assert pool.units_run == 2 * 2 * N + 3
    for g, w in zip(got, want, strict=True):
        assert [g.pop("created"), w.pop("created")] and g.pop("rows") == w.pop("rows") and g == w


def test_prune_command_on_ray_writes_the_local_files(tmp_path, capsys):
    args = ["prune", MODEL, "--tasks", TASK, "--limit", str(N), "--remove-restore", "--no-html", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "local")]) == 0
    assert cli.main([*args, "--out", str(tmp_path / "ray"), "--ray", "local", "--ray-actors", "2"]) == 0
    for name in ("prune/prune.csv", "remove_restore.csv"):
        assert (tmp_path / "ray" / name).read_text() == (tmp_path / "local" / name).read_text(), name
    got, want = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("ray", "local"))
    assert got["summary"] == want["summary"] and got["rows"] == want["rows"]
    capsys.readouterr()
