"""Shared by the review tests: one small real search (made once per session) and `forge ui` on a free port.

The store comes from `optimize` on examples/rmsnorm_swiglu.py on the CPU with a budget of 8 candidates
(real g++ builds, real worker processes). One hostile node is then added to it through the Store API, as a
child of a real candidate: its source, message, build log and LLM prompt/answer hold HTML and script, to
check that every view shows them as text.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conftest import EXAMPLES, ROOT

HOSTILE_SOURCE = '// </pre><script>alert("source")</script>\nint forge_launch() { return "<b>"; }\n'
HOSTILE_MESSAGE = '<img src=x onerror=alert("message")> [bold red]not markup[/]'
HOSTILE_LOG = "error: <script>alert('log')</script>"


@dataclass(frozen=True)
class ReviewStore:
    """Where the store is and what is in it."""

    db: Path
    run_id: str
    report: dict  # OptimizeReport.to_json() of the search
    task_id: int  # the searched task with the biggest share (the hostile node is in it)
    hostile_id: int  # the node whose texts hold HTML and script


@functools.cache
def review_store(folder: Path) -> ReviewStore:
    """Run the small search into folder/forge.db and add the hostile node (conftest builds it once a session)."""
    from forge.capture.model_input import load_file
    from forge.job import optimize
    from forge.search.driver import Budget
    from forge.store import Store

    folder.mkdir(parents=True, exist_ok=True)
    store = Store(folder / "forge.db")
    budget = Budget(candidates=8, per_task=4, min_per_task=4, parallel=2, seconds=300.0)
    report = optimize(load_file(EXAMPLES / "rmsnorm_swiglu.py"), store, budget=budget, runs_dir=folder / "runs")
    searched = [t for t in report.tasks if t.candidates]
    task = next(t for t in store.get_tasks(report.run_id) if t.key == searched[0].key)
    parent = max(store.candidates(task.id), key=lambda c: (c.status == "ok" and c.backend == "cpu", c.reward or -1))
    bad = store.add_candidate(task.id, parent.id, backend="cpu", source=HOSTILE_SOURCE, entry="forge_launch",
                              knobs={"note": "<i>knob</i>"}, origin="llm:test:hostile", status="build_error",
                              visits=1, reward=-1.0)
    store.add_evaluation(bad.id, status="build_error", message=HOSTILE_MESSAGE, build_log=HOSTILE_LOG,
                         device="cpu", device_seconds=0.0)
    store.add_llm_call(report.run_id, provider="test", model="hostile", request_hash="h0", task_id=task.id,
                       candidate_id=bad.id, prompt="write <b>a kernel</b> for <script>alert('prompt')</script>",
                       response="```c\n<script>alert('answer')</script>\n```", tokens_in=120, tokens_out=80,
                       usd=0.0125, latency_s=1.5)
    return ReviewStore(folder / "forge.db", report.run_id, report.to_json(), task.id, bad.id)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class UI:
    """A `forge ui` process and its base URL."""

    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        """Stop the server (it is our own child process)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_ui(db: Path, log: Path) -> UI:
    """Start `forge ui --db db` on a free port of 127.0.0.1 and wait until it answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "ui", "--db", str(db), "--port", str(port)],
                            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"forge ui exited with {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/api/runs", timeout=2):
                return UI(proc, url)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"forge ui did not answer within 60 s: {log.read_text()}")


LONG_REASON = "budget (16 candidates for this task; patience 8 without improvement; wall time 300 s of the run)"


def two_runs(db: Path) -> tuple[str, str, int, int]:
    """Two finished runs of one model, made through the Store API (no search), for the comparison and the
    layout: the second is faster on the shared task and has one more; timings near 125000 us (long axis labels),
    long knobs and stop reasons. Returns (run a, run b, b's shared task, b's slow node)."""
    from forge.store import Store

    store = Store(db)
    ids, found = [], (0, 0)
    for i, (speedups, extra) in enumerate((((1.2, 1.5), False), ((1.1, 2.5, 3.0), True))):
        run = store.create_run("examples/compare.py", device="cpu", dtype="fp32", policy="recipes",
                               config={"budget": {"candidates": 40, "per_task": 16}})
        keys = ["silu-compare"] + (["mean-only-b"] if extra else [])
        for key in keys:
            task = store.add_task(run.id, key, family="activation", ms=2.0, share=0.4, state="done",
                                  stop_reason=LONG_REASON)
            root = store.add_candidate(task.id, None, backend="eager", source="def region(x): ...",
                                       origin="baseline", status="ok")
            for j, x in enumerate(speedups):
                knobs = {"chunk": 64 * j, "simd": True, "unroll": 4, "fast_math": False, "tile": "8x8x128"}
                c = store.add_candidate(task.id, root.id, backend="cpu", source=HOSTILE_SOURCE, knobs=knobs,
                                        origin="recipes", status="ok", visits=1, reward=x - 1)
                store.add_evaluation(c.id, status="ok", time_us_median=125000.0 / x, baseline_us_median=125000.0,
                                     time_us_spread={"p10": 118000.0 / x, "p90": 131000.0 / x, "mean": 125500.0 / x},
                                     verify={"baseline": {"median": 125000.0, "p10": 120000.0, "p90": 130000.0}},
                                     device="cpu", device_seconds=0.5)
                if i == 1 and key == "silu-compare" and j == 0:
                    found = (task.id, c.id)
        store.update_run(run.id, state="done", eager_ms=10.0, forge_ms=10.0 / (1.1 + i))
        ids.append(run.id)
    return ids[0], ids[1], found[0], found[1]
