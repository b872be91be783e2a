"""A fair clock (issue 13 item 8): candidate and eager timed under the same conditions, and a task's eager
time the median of its paired measurements.

The protocol is asserted, not a speed (speeds are benchmarks/fair_clock.py's): the worker's real Time step,
in this process, with a real built kernel, allocates the candidate's outputs inside every timed call, as
eager and the dispatcher do. The median is checked on the eager times recorded in the issue (one 3.35 ms
outlier against 37-48 ms) through a real search into a real store, the review, and the LLM policy's lineage.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import forge.evaluate.spotcheck
from forge.bench import BenchConfig, Clock
from forge.capture.export import capture
from forge.evaluate import child
from forge.evaluate.arena import Arena
from forge.evaluate.build import build
from forge.evaluate.steps import Load, Time
from forge.kernel import Candidate, EvalResult, Feedback, Status, TaskSpec, Timing
from forge.policy.base import Policy
from forge.review.data import task_view
from forge.search.driver import Budget, search
from forge.store import Store
from forge.store.recorder import StoreRecorder
from forge.tasks.cut import Task, build_tasks

GOOD = Path(__file__).resolve().parent / "corpus" / "cpu" / "good.cpp"  # a right SiLU


class _Recording(Clock):
    """forge's clock, noting where each timed call starts and stops."""

    def __init__(self, events: list[str]) -> None:
        super().__init__("cpu")
        self.events = events

    def time_us(self, fn: Callable[[], object]) -> float:
        self.events.append("start")
        try:
            return super().time_us(fn)
        finally:
            self.events.append("stop")


def test_the_worker_allocates_the_candidates_outputs_inside_every_timed_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TaskSpec.of(build_tasks(capture(torch.nn.SiLU(), [torch.randn(64, 1000)]).graph_module.graph)[0])
    built = build(Candidate("cpu", GOOD.read_text()), cache_dir=tmp_path)
    assert built.ok, built.log
    events: list[str] = []
    fresh: list[torch.Tensor] = []  # every output the harness allocated, kept so no address is reused
    real = forge.evaluate.spotcheck.empty_output

    def counted(meta, device):  # noqa: ANN001, ANN202 - the harness's own allocation, noted
        t = real(meta, device)
        events.append("alloc")
        fresh.append(t)
        return t
    monkeypatch.setattr(forge.evaluate.spotcheck, "empty_output", counted)

    st = child._State("cpu")
    assert child.handle(Load(spec, "cpu", built.path, "forge_launch"), st).status is Status.OK
    arena = Arena("cpu")
    try:
        ins = arena.plan(spec.inputs)
        kept = ((tuple(arena.plan(spec.inputs)), tuple(arena.plan(spec.outputs))),)
        ref = arena.open()
        arena.view(ins[0]).copy_(torch.randn(64, 1000))
        st.clock = _Recording(events)
        bench = BenchConfig(warmup_s=0.0, budget_s=0.0, min_runs=6, max_runs=6)
        reply = child.handle(Time(ref, tuple(ins), kept, bench), st)
    finally:
        arena.close()
    assert reply.status is Status.OK and reply.timing is not None and reply.baseline is not None
    timed = events[events.index("start"):]
    # candidate then eager, call by call: the candidate's output allocated between its start and stop,
    # eager's inside its own op (the harness allocates nothing for it)
    assert timed == ["start", "alloc", "stop", "start", "stop"] * 6, timed
    assert events[:events.index("start")] == ["alloc"] * events.index("start")  # warm-up calls: fresh too
    assert len({t.data_ptr() for t in fresh}) == len(fresh)  # a new buffer every call, never one reused


# Eager medians (us) of one task's paired measurements, as recorded in the issue: one disturbed baseline
# of 3.35 ms among 37-48 ms.
RECORDED_EAGER = [41_200.0, 3_350.0, 37_900.0, 47_800.0, 44_100.0, 39_600.0]
CANDIDATE_US = [40_000.0, 36_000.0, 20_000.0, 7_000.0, 30_000.0, 38_000.0]  # 1.0-6.9x against their own


class _Replay(Policy):
    """Policy and evaluator in one: replays the recorded pairs, one evaluation each."""

    name = "replay"
    arch = None
    cache_dir = None
    parallel = 1  # the evaluator interface: one candidate judged at a time

    def __init__(self) -> None:
        self.n = 0

    def refusal(self, spec: TaskSpec) -> str | None:
        return None

    def propose(self, spec: TaskSpec, parent: object, feedback: object) -> list[int]:  # new payloads each time
        self.proposed = getattr(self, "proposed", 0) + len(RECORDED_EAGER)
        return list(range(self.proposed - len(RECORDED_EAGER), self.proposed))

    def render(self, spec: TaskSpec, payload: int) -> Candidate:  # a source of its own each: none is a duplicate
        return Candidate("cpu", GOOD.read_text() + f"static const int variant = {payload};\n")

    def evaluate_many(self, spec: TaskSpec, cands: list[Candidate], seed: int = 0) -> Iterator[EvalResult]:
        for _ in cands:
            k, self.n = self.n, self.n + 1
            yield EvalResult(Status.OK, timing=_t(CANDIDATE_US[k]), baseline=_t(RECORDED_EAGER[k]), floor_us=100.0)

    def retime(self, spec: TaskSpec, cand: Candidate, bench: object) -> EvalResult:
        return EvalResult(Status.TIMEOUT, "replayed: not timed again (the recorded timing stands)")


def _t(us: float) -> Timing:
    return Timing(us, us, us, us, 0.0, 10)


def test_an_outlier_eager_time_does_not_decide_a_tasks_speedup(tmp_path: Path) -> None:
    from forge.capture.export import TensorMeta

    meta = TensorMeta((1024,), "float32", (1,))
    task = Task("silu", "activation", ("aten.silu.default",), (meta,), (meta,), "# silu\n", 1, 100.0, 1.0)
    store = Store(tmp_path / "f.db")
    run = store.create_run("replay", device="cpu", policy="replay")
    replay = _Replay()
    budget = Budget(candidates=len(RECORDED_EAGER), per_task=len(RECORDED_EAGER), min_per_task=len(RECORDED_EAGER),
                    parallel=1, patience=100, min_share=0.01)
    (out,) = search([task], replay, replay, StoreRecorder(store, run.id), budget)
    assert replay.n == len(RECORDED_EAGER)
    # The task's speedup is its best node's (issue 16): that node against the eager timed alongside it, not
    # against the smallest eager of the task (the outlier's 3 350 us: "no gain 0.48x"); the search's own
    # decisions read the median of the pairs (TaskSearch.eager_us)
    paired = RECORDED_EAGER[CANDIDATE_US.index(min(CANDIDATE_US))]
    assert out.eager_us == paired != min(RECORDED_EAGER) and out.best_us == min(CANDIDATE_US)
    assert out.speedup == pytest.approx(paired / 7_000.0) and out.status == "improved"
    (rec,) = store.get_tasks(run.id)
    view = task_view(store, rec)
    assert view.eager_us == paired and view.speedup == pytest.approx(out.speedup)


def test_the_llm_policy_reads_eager_from_the_search(tmp_path: Path) -> None:
    """Policies keep no eager time of their own: the LLM policy's prompts show the search's, the median of the
    paired measurements (not the smallest)."""
    from forge.capture.export import TensorMeta
    from forge.policy.llm.cache import CallLog
    from forge.policy.llm.policy import LLMPolicy
    from forge.policy.llm.prices import Price
    from forge.policy.llm.providers import ProviderSpec

    class Told(_Replay):
        def __init__(self) -> None:
            super().__init__()
            self.told: list[Feedback] = []

        def propose(self, spec: TaskSpec, parent: object, feedback: object) -> list[int]:
            self.told.append(feedback)
            return super().propose(spec, parent, feedback) if parent is None else []

    meta = TensorMeta((1024,), "float32", (1,))
    task = Task("silu", "activation", ("aten.silu.default",), (meta,), (meta,), "# silu\n", 1, 100.0, 1.0)
    store = Store(tmp_path / "f.db")
    told = Told()
    n = len(RECORDED_EAGER)
    search([task], told, told, StoreRecorder(store, store.create_run("told", device="cpu", policy="told").id),
           Budget(candidates=n, per_task=n, min_per_task=n, parallel=1, patience=100, min_share=0.01))
    # every time, the median of the eager times paired with the candidates evaluated so far (in that order)
    seen = [f for f in told.told if f.tried]
    assert seen and all(f.eager_us == statistics.median(RECORDED_EAGER[:f.tried]) for f in seen)
    last = max(seen, key=lambda f: f.tried)
    assert last.tried >= 3 and last.eager_us != min(RECORDED_EAGER[:last.tried])

    provider = ProviderSpec("openai", "fake-coder", "http://127.0.0.1:9/v1")  # nothing is asked
    policy = LLMPolicy(CallLog(provider, None, Price(1.0, 2.0)), device="cpu")
    spec = TaskSpec.of(task)
    idea = policy.propose(spec, None, last)[0]
    text = policy._prompt(spec, "first", None, 0, policy._nodes[idea.id]).text
    assert f"{last.eager_us:.2f} us" in text
    policy.close()
