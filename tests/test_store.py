"""Tests of forge.store against real SQLite files (schema, round trips, trees, costs, WAL and concurrency) and,
where `sh .ci/postgres.sh` could start one, a real PostgreSQL server: the `store` tests run on both."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import re
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forge.store import (
    CandidateRecord,
    EvaluationRecord,
    LLMCallRecord,
    RunCost,
    RunRecord,
    Store,
    TaskRecord,
    resolve_url,
)

TABLES = {"runs", "tasks", "candidates", "evaluations", "llm_calls"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Path of a fresh database file."""
    return tmp_path / "forge.db"


# The server .ci/postgres.sh starts (or FORGE_TEST_PG_URL): a throwaway database on a Unix socket.
PG_URL = os.environ.get("FORGE_TEST_PG_URL",
                        "postgresql+psycopg://forge@/forge_test?host=/tmp/forge-pg&port=54329")


def _fresh_postgres() -> str:
    """PG_URL with an empty public schema, or a skip saying why there is none."""
    try:
        import sqlalchemy
    except ImportError as e:  # pragma: no cover - a dependency of forge
        pytest.skip(f"no sqlalchemy: {e}")
    try:
        engine = sqlalchemy.create_engine(PG_URL, connect_args={"connect_timeout": 2})
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("DROP SCHEMA public CASCADE"))
            conn.execute(sqlalchemy.text("CREATE SCHEMA public"))
        engine.dispose()
    except Exception as e:  # noqa: BLE001 - no driver, no server: the reason is the skip's
        pytest.skip(f"no PostgreSQL server at {PG_URL} (sh .ci/postgres.sh starts one): {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]}")
    return PG_URL


@pytest.fixture
def sqlite_store(db: Path) -> Iterator[Store]:
    """A store on a fresh SQLite file (for what only SQLite has)."""
    with Store(db) as s:
        yield s


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, db: Path) -> Iterator[Store]:
    """A store on a fresh SQLite file, or on an empty PostgreSQL database."""
    with Store(db if request.param == "sqlite" else _fresh_postgres()) as s:
        yield s


def _tables(path: Path) -> set[str]:
    """Names of the tables in a SQLite file, read with the standard library."""
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


# -- opening ----------------------------------------------------------------------------------------


def test_schema_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "forge.db"
    assert not path.exists()
    Store(path).close()
    assert path.exists()
    assert TABLES <= _tables(path)
    # Reopening an existing file keeps what is there.
    with Store(str(path)) as s:
        run = s.create_run("m.py")
    with Store(f"sqlite:///{path}") as s:
        assert s.get_run(run.id) == run


def test_default_location_is_runs_forge_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Store() as s:
        s.create_run("zoo:resnet50")
    assert (tmp_path / "runs" / "forge.db").is_file()
    assert TABLES <= _tables(tmp_path / "runs" / "forge.db")


def test_url_rule(tmp_path: Path) -> None:
    assert resolve_url(tmp_path / "a.db") == f"sqlite:///{tmp_path / 'a.db'}"
    assert resolve_url(str(tmp_path / "b.db")) == f"sqlite:///{tmp_path / 'b.db'}"
    assert resolve_url("postgresql://u@h/forge") == "postgresql://u@h/forge"
    assert resolve_url(f"sqlite:///{tmp_path}/c/d.db") == f"sqlite:///{tmp_path}/c/d.db"
    assert (tmp_path / "c").is_dir()  # folder of a SQLite URL is created too


def test_sqlite_pragmas(sqlite_store: Store, db: Path) -> None:
    with sqlite_store._reader.connect() as conn:  # the store's own connections
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")
        }
    assert pragma == {"journal_mode": "wal", "busy_timeout": 30000, "synchronous": 1, "foreign_keys": 1}
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# -- round trips ------------------------------------------------------------------------------------


def test_run_round_trip(store: Store) -> None:
    run = store.create_run(
        "zoo:llama",
        device="NVIDIA H200",
        dtype="bfloat16",
        policy="mcts",
        config={"budget": {"minutes": 30}, "backends": ["triton", "cuda"]},
        note="first",
    )
    assert isinstance(run, RunRecord)
    assert re.fullmatch(r"r\d{8}-[0-9a-f]{6}", run.id)
    assert run.state == "running" and run.finished_at is None and run.created_at.tzinfo is not None
    assert store.get_run(run.id) == run
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.state = "done"  # type: ignore[misc]

    done = store.update_run(run.id, state="done", eager_ms=12.5, forge_ms=8.0)
    assert done.state == "done" and done.eager_ms == 12.5 and done.forge_ms == 8.0
    assert done.finished_at is not None and done.finished_at >= run.created_at
    assert store.get_run(run.id) == done

    other = store.create_run("b.py", run_id="r-custom")
    assert [r.id for r in store.list_runs()] == ["r-custom", run.id]
    assert [r.id for r in store.list_runs(state="done")] == [run.id]
    assert [r.id for r in store.list_runs(limit=1)] == [other.id]
    with pytest.raises(ValueError):
        store.create_run("c.py", run_id="r-custom")
    with pytest.raises(ValueError):
        store.update_run(run.id, state="exploded")
    with pytest.raises(TypeError):
        store.update_run(run.id, colour="blue")
    with pytest.raises(TypeError):
        store.update_run(run.id, id="r-other")


def test_unknown_ids_raise_key_error(store: Store) -> None:
    with pytest.raises(KeyError, match="unknown run id 'r-nope'"):
        store.get_run("r-nope")
    for call in (
        lambda: store.update_run("r-nope", note="x"),
        lambda: store.add_task("r-nope", "k"),
        lambda: store.get_tasks("r-nope"),
        lambda: store.run_cost("r-nope"),
        lambda: store.llm_calls("r-nope"),
        lambda: store.add_llm_call("r-nope", provider="p", model="m", request_hash="h"),
    ):
        with pytest.raises(KeyError, match="unknown run id"):
            call()
    with pytest.raises(KeyError, match="unknown task id"):
        store.add_candidate(999, backend="cpu")
    with pytest.raises(KeyError, match="unknown candidate id"):
        store.add_evaluation(999, status="ok")
    assert store.list_runs() == []  # failed writes left nothing behind


def test_task_round_trip(store: Store) -> None:
    run = store.create_run("m.py")
    meta = {
        "ops": ["aten.mm", "aten.relu"],
        "inputs": [{"shape": [64, 128], "dtype": "float16", "stride": [128, 1]}],
    }
    a = store.add_task(
        run.id,
        "mm+relu|64x128",
        family="matmul",
        count=3,
        ms=1.25,
        share=0.4,
        source="def f(x): ...",
        meta=meta,
    )
    b = store.add_task(run.id, "softmax|64", family="reduction")
    assert isinstance(a, TaskRecord) and a.meta == meta and a.state == "pending" and a.stop_reason is None
    assert store.get_tasks(run.id) == [a, b]
    assert store.get_task(a.id) == a
    with pytest.raises(ValueError, match="already has a task"):
        store.add_task(run.id, "mm+relu|64x128")
    # The same key is fine in another run.
    assert store.add_task(store.create_run("n.py").id, "mm+relu|64x128").key == a.key
    stopped = store.update_task(a.id, state="done", stop_reason="budget")
    assert (stopped.state, stopped.stop_reason) == ("done", "budget")
    assert store.get_tasks(run.id)[0] == stopped


def test_candidate_tree(store: Store) -> None:
    task = store.add_task(store.create_run("m.py").id, "k")
    a = store.add_candidate(task.id, backend="eager", origin="recipe")
    b = store.add_candidate(
        task.id,
        backend="triton",
        source="@triton.jit ...",
        entry="kernel",
        knobs={"BLOCK": 128, "num_warps": 4},
        origin="llm:openai:gpt-x",
    )
    a1 = store.add_candidate(task.id, a.id, backend="cuda")
    b1 = store.add_candidate(task.id, b.id, backend="triton", knobs={"BLOCK": 64})
    a2 = store.add_candidate(task.id, a.id, backend="cpu")
    a11 = store.add_candidate(task.id, a1.id, backend="cuda")
    assert isinstance(b, CandidateRecord)
    assert (b.knobs, b.entry, b.origin, b.status, b.visits, b.reward) == (
        {"BLOCK": 128, "num_warps": 4},
        "kernel",
        "llm:openai:gpt-x",
        "pending",
        0,
        None,
    )

    tree = store.candidates(task.id)
    assert [c.id for c in tree] == [a.id, a1.id, a11.id, a2.id, b.id, b1.id]
    parents = {c.id: c.parent_id for c in tree}
    assert parents == {a.id: None, a1.id: a.id, a11.id: a1.id, a2.id: a.id, b.id: None, b1.id: b.id}

    assert store.get_candidate(a11.id) == a11
    with pytest.raises(ValueError):
        store.add_candidate(task.id, backend="fortran")
    other = store.add_task(store.get_task(task.id).run_id, "k2")
    with pytest.raises(ValueError, match="belongs to task"):
        store.add_candidate(other.id, a.id, backend="cpu")
    assert store.candidates(other.id) == []


def test_evaluation_round_trip(store: Store) -> None:
    task = store.add_task(store.create_run("m.py").id, "k")
    cand = store.add_candidate(task.id, backend="triton")
    spread = {"p10": 9.5, "p90": 11.0, "std": 0.4, "n": 50}
    ok = store.add_evaluation(
        cand.id,
        status="ok",
        verify={"max_abs_err": 1e-3, "passed": True},
        time_us_median=10.0,
        time_us_spread=spread,
        baseline_us_median=25.0,
        device="NVIDIA H200",
        device_seconds=2.5,
    )
    bad = store.add_evaluation(
        cand.id,
        status="build_failed",
        message="nvcc error",
        build_log="error: expected ';'",
        device_seconds=0.5,
    )
    assert isinstance(ok, EvaluationRecord)
    assert ok.time_us_spread == spread and ok.verify["passed"] is True and ok.speedup == 2.5
    assert bad.speedup is None and bad.build_log == "error: expected ';'"
    assert store.evaluations(cand.id) == [ok, bad]


def test_llm_call_cache(store: Store) -> None:
    run = store.create_run("m.py")
    task = store.add_task(run.id, "k")
    cand = store.add_candidate(task.id, backend="triton")
    first = store.add_llm_call(
        run.id,
        provider="openai",
        model="gpt-x",
        request_hash="abc",
        prompt="p",
        response="r1",
        tokens_in=100,
        tokens_out=20,
        latency_s=1.5,
        usd=0.01,
        task_id=task.id,
        candidate_id=cand.id,
    )
    newer = store.add_llm_call(run.id, provider="openai", model="gpt-x", request_hash="abc", response="r2")
    failed = store.add_llm_call(
        run.id, provider="openai", model="gpt-x", request_hash="abc", status="error", response=""
    )
    assert isinstance(first, LLMCallRecord) and (first.task_id, first.candidate_id) == (task.id, cand.id)
    assert store.find_llm_call("abc") == newer
    assert store.find_llm_call("abc", status=None) == failed
    assert store.find_llm_call("zzz") is None
    assert store.llm_calls(run.id) == [first, newer, failed]



def test_llm_calls_linked_to_their_candidate_and_its_task(store: Store) -> None:
    run = store.create_run("m.py")
    task = store.add_task(run.id, "k")
    a, b = (store.add_candidate(task.id, backend="cpu") for _ in range(2))
    calls = [store.add_llm_call(run.id, provider="openai", model="gpt-x", request_hash=h) for h in "xyz"]
    assert all((c.task_id, c.candidate_id) == (None, None) for c in calls)
    store.link_llm_calls([calls[0].id, calls[1].id], a.id)
    store.link_llm_calls([calls[1].id], b.id)  # already linked: stays with a
    store.link_llm_calls([], b.id)
    linked = {c.id: (c.task_id, c.candidate_id) for c in store.llm_calls(run.id)}
    assert linked == {calls[0].id: (task.id, a.id), calls[1].id: (task.id, a.id), calls[2].id: (None, None)}
    with pytest.raises(KeyError):
        store.link_llm_calls([calls[2].id], 999999)


def test_run_cost(store: Store) -> None:
    run = store.create_run("m.py")
    assert store.run_cost(run.id) == RunCost(0.0, 0, 0, 0.0, 0, 0)
    for key in ("k1", "k2"):
        task = store.add_task(run.id, key)
        cand = store.add_candidate(task.id, backend="cuda")
        store.add_evaluation(cand.id, status="ok", device_seconds=1.25)
        store.add_evaluation(
            store.add_candidate(task.id, cand.id, backend="cuda").id, status="ok", device_seconds=0.5
        )
        store.add_llm_call(
            run.id,
            task_id=task.id,
            provider="anthropic",
            model="m",
            request_hash=key,
            tokens_in=1000,
            tokens_out=200,
            usd=0.02,
        )
    # Another run's spending must not leak in.
    other = store.create_run("n.py")
    other_cand = store.add_candidate(store.add_task(other.id, "k1").id, backend="cpu")
    store.add_evaluation(other_cand.id, status="ok", device_seconds=100.0)
    store.add_llm_call(other.id, provider="p", model="m", request_hash="x", usd=5.0, tokens_in=7)

    cost = store.run_cost(run.id)
    assert cost.usd == pytest.approx(0.04)
    assert (cost.tokens_in, cost.tokens_out, cost.llm_calls, cost.evaluations) == (2000, 400, 2, 4)
    assert cost.device_seconds == pytest.approx(3.5)
    assert store.run_cost(other.id).device_seconds == pytest.approx(100.0)


# -- several processes ------------------------------------------------------------------------------


def _concurrent_writer(path: str, task_id: int, worker: int, n: int, start: object) -> None:
    """Child process: wait for the start signal, then add n candidates, each with an evaluation."""
    store = Store(path)
    start.wait(30)  # type: ignore[attr-defined]
    parent = None
    for i in range(n):
        cand = store.add_candidate(task_id, parent, backend="triton", origin=f"w{worker}", knobs={"i": i},
                                   status="ok", visits=1)
        store.add_evaluation(cand.id, status="ok", time_us_median=float(i + 1), device_seconds=0.01)
        parent = cand.id if i % 5 == 0 else parent
    store.close()


def test_concurrent_writers(db: Path) -> None:
    workers, n = 4, 50
    with Store(db) as s:
        run = s.create_run("m.py")
        task = s.add_task(run.id, "k")
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_concurrent_writer, args=(str(db), task.id, w, n, start)) for w in range(workers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.2)
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers

    with Store(db) as s:
        cands = s.candidates(task.id)
        assert len(cands) == workers * n
        assert all(c.status == "ok" and c.visits == 1 for c in cands)
        for w in range(workers):
            mine = [c for c in cands if c.origin == f"w{w}"]
            assert sorted(c.knobs["i"] for c in mine) == list(range(n))
        assert sum(len(s.evaluations(c.id)) for c in cands) == workers * n
        assert s.run_cost(run.id).device_seconds == pytest.approx(0.01 * workers * n)
        assert s.run_cost(run.id).evaluations == workers * n


def _endless_writer(path: str, task_id: int, conn: object) -> None:
    """Child process: add candidates one by one, reporting each committed count through the pipe."""
    store = Store(path)
    for i in range(1, 100_000):
        store.add_candidate(task_id, backend="cpu", origin=f"n{i}")
        conn.send(i)  # type: ignore[attr-defined]


def test_sigkill_loses_nothing_committed(db: Path) -> None:
    with Store(db) as s:
        task = s.add_task(s.create_run("m.py").id, "k")
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_endless_writer, args=(str(db), task.id, sender))
    proc.start()
    sender.close()
    reported = 0
    deadline = time.monotonic() + 30
    while reported < 40 and time.monotonic() < deadline:
        if receiver.poll(1):
            reported = receiver.recv()
    os.kill(proc.pid, signal.SIGKILL)  # mid-write: it never stops on its own
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    while receiver.poll(0.1):
        try:
            reported = receiver.recv()
        except EOFError:
            break
    assert reported >= 40

    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Store(db) as s:
        kept = s.candidates(task.id)
        assert len(kept) >= reported
        assert {c.origin for c in kept} >= {f"n{i}" for i in range(1, reported + 1)}
        s.add_candidate(task.id, backend="cpu")  # and the file is still writable
