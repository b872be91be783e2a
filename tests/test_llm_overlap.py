"""Tasks probed at once each wait for their own LLM answer: one slow request never holds the others back.

The LLM policy is the real one (the OpenAI SDK against the local fake server); the evaluator is a stand-in
that judges every candidate at once (the requests are the subject, not the kernels). The store is a real
SQLite file.
"""

from collections.abc import Iterator
from pathlib import Path

from llm_server import FakeLLM, Step

from forge.capture.export import TensorMeta
from forge.kernel import Candidate, EvalResult, Status, TaskSpec
from forge.policy.llm import LLMConfig, RetryConfig, make_llm_policy
from forge.search.driver import Budget, search
from forge.store import Store
from forge.store.recorder import StoreRecorder
from forge.tasks.cut import Task

GOOD = (Path(__file__).parent / "llm" / "good.cpp").read_text()
META = TensorMeta((1024,), "float32", (1,))
SLOW_S = 1.5  # each answer takes this long


def task(key: str, share: float) -> Task:
    return Task(key, "activation", ("aten.sin.default",), (META,), (META,), f"# {key}\n", 1, 100 * share, share)


class Instant:
    """The evaluator interface: four candidates judged at once, each failing at once."""

    parallel = 4

    def evaluate_many(self, spec: TaskSpec, cands: list[Candidate], seed: int = 0) -> Iterator[EvalResult]:
        return iter([EvalResult(Status.BUILD_ERROR, "not built: the stand-in evaluator") for _ in cands])

    def retime(self, spec: TaskSpec, cand: Candidate, bench: object) -> EvalResult:
        return EvalResult(Status.TIMEOUT, "not timed again")


def test_two_tasks_probed_at_once_have_their_requests_in_flight_together(tmp_path, monkeypatch):
    """Budget: one candidate a task, batches of one, two tasks probed at once (four workers): each task's
    thread sends one request and waits for its answer, which takes SLOW_S; the two must overlap."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    store = Store(tmp_path / "f.db")
    answer = f"Here it is.\n\n```cpp\n{GOOD}```\n"
    with FakeLLM(lambda p: [Step(answer, sleep_s=SLOW_S)]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        policy = make_llm_policy("openai:gpt-4o-mini", "cpu", store=store,
                                 retry=RetryConfig(attempts=1, base_s=0.01, timeout_s=30.0),
                                 config=LLMConfig(width=1, max_first=1, rounds=1, concurrency=4))
        run = store.create_run("two", device="cpu", policy=policy.name)
        policy.bind(store, run.id)
        budget = Budget(candidates=2, per_task=1, min_per_task=1, parallel=1, patience=100, min_share=0.01,
                        seconds=60)
        try:
            out = search([task("a", 0.6), task("b", 0.4)], policy, Instant(), StoreRecorder(store, run.id), budget)
        finally:
            policy.close()
        sent = server.completions()
    assert [o.candidates for o in out] == [1, 1]
    assert len(sent) == 2 and server.max_in_flight == 2, [s.at - sent[0].at for s in sent]
    assert abs(sent[1].at - sent[0].at) < SLOW_S / 2  # the second did not wait for the first's answer
