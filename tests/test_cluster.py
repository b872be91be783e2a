"""Evaluation spread over workers: N CPU workers on this host, and a local Ray cluster started here.

"Equal" results are what is deterministic: the set of candidates (task, source), their statuses and their
verification (which sets passed, and the error values to 9 significant digits: the inputs come from a fixed
seed; eager's own error moves in its last bits with the judge's thread count, which Ray sets to an actor's
CPUs). Timings differ from run to run, and an MCTS steers by them, so these runs verify without timing
(bench=None): every candidate gets the same reward and the trees grow alike whatever the number of workers.
The worker processes, compilers, the Ray cluster and SQLite are real.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
from conftest import MODELS, ROOT

from forge.capture.model_input import load_file
from forge.capture.profile import profile_model
from forge.evaluate.evaluator import Evaluator
from forge.policy.recipes.policy import RecipePolicy
from forge.search.driver import Budget, search
from forge.store import Store
from forge.store.recorder import StoreRecorder

BUDGET = Budget(candidates=10, per_task=5, min_per_task=3, parallel=3, patience=100, seconds=900.0, min_share=0.0)


@pytest.fixture(scope="module")
def tasks():
    prof, _ = profile_model(load_file(MODELS / "two_tasks.py"), budget_s=0.05)
    return list(prof.tasks)


def run(tasks, ev, store) -> str:
    r = store.create_run("two_tasks", device="cpu", dtype="float32", policy="recipes")
    search(tasks, RecipePolicy("cpu"), ev, StoreRecorder(store, r.id), BUDGET)
    return r.id


def rounded(v: object) -> object:
    """Verification details with every float to 9 significant digits."""
    if isinstance(v, dict):
        return tuple(sorted((k, rounded(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(rounded(x) for x in v)
    return f"{v:.9g}" if isinstance(v, float) else v


def stored(store, run_id) -> list[tuple]:
    """(task, source, status, verification) of every evaluated candidate, sorted; the root excluded."""
    out = []
    for t in store.get_tasks(run_id):
        for c in store.candidates(t.id):
            evs = store.evaluations(c.id)
            if c.parent_id is not None and evs:
                out.append((t.key, c.source, c.status, evs[0].status, rounded(evs[0].verify)))
    return sorted(out)


@pytest.fixture(scope="module")
def single(tasks, tmp_path_factory):
    """The single-worker run every other is compared with."""
    store = Store(tmp_path_factory.mktemp("one") / "f.db")
    with Evaluator("cpu", bench=None, seed=0, cache_dir=tmp_path_factory.mktemp("cache1")) as ev:
        rows = stored(store, run(tasks, ev, store))
    assert len(rows) == BUDGET.candidates and any(r[3] == "ok" for r in rows)
    return rows


@pytest.mark.slow
def test_n_cpu_workers_store_what_one_does(tasks, single, tmp_path):
    store = Store(tmp_path / "f.db")
    with Evaluator("cpu", workers=3, bench=None, seed=0, cache_dir=tmp_path / "cache") as ev:
        assert ev.parallel == 3 and len(ev.workers) == 3
        assert stored(store, run(tasks, ev, store)) == single
        assert len({w.proc.pid for w in ev.workers if w.proc}) == 3  # all three judged (each started on its first)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # a small local cluster: three CPUs (two actors, one for builds), no dashboard, a small object store
    ray.init(num_cpus=3, include_dashboard=False, object_store_memory=80 << 20, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_a_ray_cluster_stores_what_one_worker_does(ray_cluster, tasks, single, tmp_path):
    from forge.evaluate.cluster import RayEvaluator

    store = Store(tmp_path / "f.db")
    with RayEvaluator(None, "cpu", workers=2, bench=None, seed=0, cache_dir=tmp_path / "cache") as ev:
        assert ev.parallel == 2 and len(set(ev.pids())) == 2 and os.getpid() not in ev.pids()
        folders = [f for a in ev.actors for f in ray_cluster.get(a.folders.remote())]
        assert len(folders) == 4 and all(os.path.isdir(f) for f in folders)
        rid = run(tasks, ev, store)
    assert stored(store, rid) == single
    assert not [f for f in folders if os.path.exists(f)]  # each actor cleaned up before it was killed
    devices = {e.device for t in store.get_tasks(rid) for c in store.candidates(t.id) for e in store.evaluations(c.id)}
    assert devices and all(d.startswith("cpu@") for d in devices)  # judged on the actors, named by node


@pytest.mark.slow
def test_killing_a_ray_actor_mid_run_loses_no_evaluated_candidate(ray_cluster, tasks, single, tmp_path):
    from forge.evaluate.cluster import RayEvaluator

    store = Store(tmp_path / "f.db")
    kills: list[int] = []
    done = threading.Event()
    with RayEvaluator(None, "cpu", workers=2, bench=None, seed=0, cache_dir=tmp_path / "cache") as ev:

        def killer() -> None:  # SIGKILL an actor while it judges: until one kill has hit a candidate in flight
            pids = ev.pids()  # asked while the actors are idle: an actor answers one call at a time
            while not done.is_set() and ev.slots.lost == 0 and len(kills) < 4:
                busy = ev.slots.busy()
                if not busy:
                    time.sleep(0.02)
                    continue
                time.sleep(0.05)  # its judge call is on its way
                os.kill(pids[busy[0]], signal.SIGKILL)
                kills.append(pids[busy[0]])
                deadline = time.monotonic() + 20
                while not done.is_set() and ev.slots.lost == 0 and time.monotonic() < deadline:
                    time.sleep(0.1)
                if ev.slots.lost == 0 and not done.is_set():
                    try:  # the kill missed: Ray started that actor again, with a new pid
                        pids = ev.pids()
                    except Exception:  # noqa: BLE001 - still restarting: the next look asks again
                        time.sleep(1.0)

        t = threading.Thread(target=killer)
        t.start()
        try:
            rid = run(tasks, ev, store)
        finally:
            done.set()
            t.join()
        assert ev.slots.lost >= 1, f"no kill of {kills} hit a candidate in flight"
        assert kills[-1] not in ev.pids()  # Ray started the killed actor again
    assert stored(store, rid) == single  # every candidate evaluated, none a crash of the lost actor


def probes(store, run_id, n: int) -> dict[str, list[tuple]]:
    """Each task's first `n` evaluated candidates (its probe), in the order they were stored, with their times."""
    out = {}
    for t in store.get_tasks(run_id):
        rows = sorted((e.id, e.created_at, c.source, e.status) for c in store.candidates(t.id) if c.parent_id
                      for e in store.evaluations(c.id)[:1])
        if rows:
            out[t.key] = rows[:n]
    return out


@pytest.mark.slow
def test_tasks_are_probed_at_once_when_the_workers_outnumber_a_batch(tasks, tmp_path):
    # 4 workers, batches of 2: two tasks probed at once; a budget the probe (at most half of it) takes whole
    budget = replace(BUDGET, parallel=2, min_per_task=6, candidates=24)
    found = {}
    for workers in (1, 4):
        store = Store(tmp_path / f"{workers}.db")
        with Evaluator("cpu", workers=workers, bench=None, seed=0, cache_dir=tmp_path / "cache") as ev:
            for w in ev.workers:  # started before: the probes' overlap is not a race between worker starts
                w.start()
            r = store.create_run("two_tasks", device="cpu", dtype="float32", policy="recipes")
            search(tasks, RecipePolicy("cpu"), ev, StoreRecorder(store, r.id), budget)
        found[workers] = probes(store, r.id, budget.min_per_task)
    one, four = found[1], found[4]
    same = {k: [x[2:] for x in v] for k, v in one.items()}
    assert len(one) == 2 and same == {k: [x[2:] for x in v] for k, v in four.items()}  # sources and statuses
    (_, a1), (b0, _) = sorted((v[0][1], v[-1][1]) for v in four.values())
    assert b0 < a1, "the second task's probe started only after the first's ended"
    (_, a1), (b0, _) = sorted((v[0][1], v[-1][1]) for v in one.values())
    assert a1 <= b0  # one worker: one task after the other


@pytest.mark.parametrize("argv, says", [
    (["--gpus", "2"], "--gpus needs --device cuda"),
    (["--device", "cuda", "--gpus", "many"], "Invalid --gpus: 'many'"),
    (["--device", "cuda", "--gpus", "0"], "Invalid --gpus: '0'"),
    (["--workers", "0"], "Invalid --workers: 0"),
    (["--device", "cuda", "--workers", "2"], "Invalid --workers: 2"),
])
def test_bad_worker_options_are_one_line_and_exit_2(argv, says, capsys, tmp_path):
    from forge.cli import main

    assert main(["optimize", str(MODELS / "two_tasks.py"), "--db", str(tmp_path / "f.db"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forge: error: {says}") and "\n" not in err, err


@pytest.mark.slow
def test_forge_optimize_with_two_cpu_workers(tmp_path, monkeypatch):
    import json

    from forge.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["optimize", str(MODELS / "two_tasks.py"), "--workers", "2", "--budget", "6", "--seconds", "120",
                 "--no-inductor", "--db", str(tmp_path / "f.db"), "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["outputs_match"] is True and sum(t["candidates"] for t in report["tasks"]) > 0


def test_closing_the_slots_judges_nothing_more():
    """A job that has not taken its slot when the evaluator closes (Ctrl-C) never judges: the one judging
    finishes, the waiting one is cancelled."""
    import concurrent.futures as cf
    import threading

    from forge.evaluate.pool import Slots

    slots: Slots[str] = Slots(["only"])
    started, release, ran = threading.Event(), threading.Event(), []

    def long_job(slot: str) -> str:
        started.set()
        release.wait(5)
        ran.append("long")
        return "judged"

    first = slots.submit(long_job)
    started.wait(5)
    second = slots.submit(lambda slot: ran.append("second") or "judged")  # waits for the one slot
    closer = threading.Thread(target=slots.close)
    closer.start()
    while not slots._closing.is_set():  # close() has begun (it then waits for the judging job)
        time.sleep(0.01)
    release.set()
    closer.join(10)
    assert first.result() == "judged" and ran == ["long"]
    with pytest.raises(cf.CancelledError):
        second.result()


def test_the_slots_say_which_are_judging():
    from forge.evaluate.pool import Slots

    slots: Slots[int] = Slots([0, 1])
    started, release = threading.Event(), threading.Event()

    def job(slot: int) -> int:
        started.set()
        release.wait(5)
        return slot

    assert slots.busy() == []
    fut = slots.submit(job)
    started.wait(5)
    assert slots.busy() == [0]  # the first free slot is taken, the other is free
    release.set()
    assert fut.result(5) == 0
    deadline = time.monotonic() + 5
    while slots.busy() and time.monotonic() < deadline:  # given back just after the job returns
        time.sleep(0.01)
    assert slots.busy() == []
    slots.close()


def forge_cli(args: list[str], tmp_path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """`forge ARGS` in a process of its own, as a user starts it."""
    path = os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": path})


def closed_port() -> int:
    """A port of this host nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_ray_address_nobody_listens_on_is_one_line_and_exit_2_at_once(tmp_path):
    pytest.importorskip("ray")
    address = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    done = forge_cli(["optimize", str(MODELS / "two_tasks.py"), "--ray", address, "--no-inductor", "--budget", "2",
                      "--db", str(tmp_path / "f.db")], tmp_path)  # Ray alone retried it for minutes
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and err[-1].startswith(f"forge: error: cannot reach the Ray cluster at {address}")
    assert "Traceback" not in done.stderr and time.monotonic() - start < 90


@pytest.mark.slow
def test_forge_optimize_ray_without_ray_installed_is_one_line_and_exit_2(tmp_path):
    fake = tmp_path / "noray"
    (fake / "ray").mkdir(parents=True)
    (fake / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    done = forge_cli(["optimize", str(MODELS / "two_tasks.py"), "--ray", "local", "--no-inductor", "--budget", "2",
                      "--db", str(tmp_path / "f.db")], tmp_path, pythonpath=str(fake))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "forge: error: --ray needs Ray: pip install 'forge-kernels[ray]'"


def all_cpus_free(ray, timeout_s: float = 30.0) -> bool:
    """True once every CPU of the cluster is free again (a live actor holds one), within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_no_ray_actor_outlives_a_run_that_ends_or_fails(ray_cluster, tmp_path, monkeypatch):
    from forge.evaluate import cluster
    from forge.evaluate.cluster import RayEvaluator

    assert all_cpus_free(ray_cluster)
    with pytest.raises(RuntimeError, match="during the run"):
        with RayEvaluator(None, "cpu", workers=2, bench=None, cache_dir=tmp_path / "cache") as ev:
            assert ev.parallel == 2 and not all_cpus_free(ray_cluster, 0.5)  # the two actors hold two CPUs
            raise RuntimeError("a failure during the run")
    assert all_cpus_free(ray_cluster)

    def broken(infos, here):  # a failure after the actors started, before the evaluator is handed out
        raise RuntimeError("broken while starting")

    monkeypatch.setattr(cluster, "_one_model", broken)
    with pytest.raises(RuntimeError, match="broken while starting") as failed:
        RayEvaluator(None, "cpu", workers=2, bench=None, cache_dir=tmp_path / "cache")
    # killed, not left to Ray's reference counting: the error kept (to log or store it) holds their handles
    assert all_cpus_free(ray_cluster), "the actors started before the failure are still alive"
    assert failed.value is not None
