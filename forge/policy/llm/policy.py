"""The LLM policy: a language model proposes, repairs and optimizes kernels inside the MCTS.

A node's payload is an `Idea` (first attempt, repair after a build error or rejection, repair after a
wrong result, optimize, tune). `propose` builds each request's prompt from what the search reported
(`observe`) and sends it to a thread pool at once, so several requests are in flight while the search
builds and benchmarks; `render` waits for the answer. An answer that is not usable code gets one repair
turn; after that, or on a refusal, an empty answer, a provider failure or a spent budget, the node is a
`NoKernel`: a failed node with the reason, never an exception in the search.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from forge.backends import BACKENDS, for_device
from forge.evaluate.mismatch import Mismatch
from forge.kernel import Candidate, EvalResult, Feedback, NoKernel, Status, TaskSpec
from forge.policy.base import CallStore, Policy
from forge.policy.llm.cache import CallLog, Message
from forge.policy.llm.deadline import DaemonPool
from forge.policy.llm.facts import compiler_report, device_facts, without_report
from forge.policy.llm.limits import LLMError, quote
from forge.policy.llm.parse import Malformed, parse_answer, prose
from forge.policy.llm.prompts import (
    LANG,
    Prompt,
    measured,
    measured_numbers,
    render_prompt,
    system_prompt,
    task_context,
    throughput,
)
from forge.policy.llm.tune import variants

log = logging.getLogger(__name__)

_BUILD = {Status.BUILD_ERROR, Status.BAD_FORMAT} | {s for s in Status if s.value.startswith("forbidden_")}
_WRONG = {Status.WRONG_RESULT, Status.LOW_PRECISION, Status.NONFINITE, Status.PARTIAL_WRITE, Status.OUT_OF_BOUNDS,
          Status.LAUNCH_ERROR, Status.CONSTANT_OUTPUT, Status.STALE_RESULT}
_FIRST_HINTS = ("", "Take a different approach from the most obvious one (another parallelisation or loop order).",
                "Favour vectorised inner loops and as few passes over memory as possible.",
                "Favour cache blocking and fusing all the work into a single pass.")
_GRACE_S = 5.0  # render waits this long past the deadline for an answer (a request's timeout ends it first)
_OPT_HINTS = ("Focus on memory traffic: fewer passes, wider and aligned accesses.",
              "Focus on parallelism and work distribution, and on vectorising the inner loops.",
              "Try a structurally different algorithm or blocking.")


@dataclass(frozen=True)
class Idea:
    """The payload of an LLM node: what was asked (its answer arrives asynchronously)."""

    id: int
    kind: str  # first | repair-build | repair-wrong | optimize | tune | seed
    parent: int | None = None  # the Idea id it improves on
    note: str = ""  # tune: the knob change


@dataclass
class _Node:
    idea: Idea
    future: Future[Candidate]
    summary: str = ""  # the model's words around its code
    result: EvalResult | None = None
    rounds: int = 0  # times the search asked for its children
    children: list[int] = field(default_factory=list)
    request: Callable[[], None] | None = None  # sends the request (None: sent, or nothing to send)
    depth: int = 0  # repairs in a row that led to this node


@dataclass
class _TaskLog:
    attempts: list[str] = field(default_factory=list)  # outcome lines, oldest first (measured numbers marked)
    stats: Feedback = field(default_factory=Feedback)  # the search's statistics of the task, as last told
    firsts: int = 0
    digests: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class LLMConfig:
    """How wide the LLM policy asks."""

    width: int = 4  # first attempts at the root per round
    max_first: int = 8  # first attempts per task
    optimize: int = 2  # optimize requests below a correct kernel per round
    rounds: int = 2  # times a node may be asked for children
    concurrency: int = 4  # requests in flight
    repairs: int = 2  # repair turns in a row the search spends on one failing line of kernels
    tune: bool = False  # also propose knob changes of LLM kernels (the mixed policy)


class LLMPolicy(Policy):
    """Kernels written by a language model (docs/llm.md)."""

    def __init__(self, calls: CallLog, device: str = "cpu", backend: str | None = None,
                 config: LLMConfig | None = None) -> None:
        self.calls = calls
        self.name = calls.spec.name
        self.device = device
        self.backend = backend or for_device(device).name
        self.config = config or LLMConfig()
        self.system = system_prompt(self.backend)
        self._pool = DaemonPool(self.config.concurrency, "forge-llm")  # never joined at exit
        self._nodes: dict[int, _Node] = {}
        self._tasks: dict[str, _TaskLog] = {}
        self._ids = itertools.count(1)

    # -- search hooks -------------------------------------------------------------------------------
    def bind(self, store: CallStore, run_id: str) -> None:
        """Record calls in this run (and look the cache up in this store); the search's recorder links each
        call to the node its answer became, and so to its task."""
        self.calls.bind(store, run_id)

    def stop_reason(self) -> str | None:
        """Why the search must stop (the --max-usd budget is spent), or None."""
        return self.calls.budget_spent()

    def until(self, deadline: float) -> None:
        """Every request ends by the search's deadline (its timeout is the time left)."""
        self.calls.deadline = deadline

    def close(self) -> None:
        """Drop requests not yet sent and close the connection: once the search is over, nothing in this
        process (a kernel loaded by the end-to-end check) can send a request."""
        self._pool.shutdown()
        self.calls.close()

    def refusal(self, spec: TaskSpec) -> str | None:
        """Any task is the model's to try, on a device its backend runs on."""
        if (BACKENDS[self.backend].device == "cpu") != (self.device == "cpu"):
            return f"a {self.backend} kernel cannot run on {self.device}"
        return None

    def propose(self, spec: TaskSpec, parent: Any, feedback: Feedback | None = None) -> list[Any]:
        """Root: first attempts; a failed node: its repair; a correct one: optimize (and tune) requests."""
        if self.stop_reason():
            return []
        self.told(spec, feedback)
        tl = self._log(spec)
        if parent is None:
            n = min(self.config.width, self.config.max_first - tl.firsts)
            ideas = [self._ask(spec, "first", None, tl.firsts + i) for i in range(max(0, n))]
            tl.firsts += len(ideas)
            return ideas
        node = self._nodes.get(parent.id) if isinstance(parent, Idea) else None
        if node is None or node.result is None or isinstance(node.future.result(), NoKernel):
            return []  # nothing to improve on: no code
        node.rounds += 1
        if node.rounds > self.config.rounds:
            return []
        status = node.result.status
        if status.passed:
            ideas = [self._ask(spec, "optimize", node, i) for i in range(self.config.optimize)]
            return ideas + (self.tunes(spec, node) if self.config.tune else [])
        return [self._ask(spec, "repair-build" if status in _BUILD else "repair-wrong", node, node.rounds - 1)]

    def told(self, spec: TaskSpec, feedback: Feedback | None) -> None:
        """The search's statistics of the task (its best, eager time, floor) for the prompts built next."""
        if feedback is not None:
            self._log(spec).stats = feedback

    def chosen(self, spec: TaskSpec, payloads: list[Any]) -> None:
        """Send the requests of the ideas the search evaluates next (an idea never chosen costs nothing)."""
        for p in payloads:
            self._send(self._nodes[p.id])

    def repairable(self, spec: TaskSpec, payload: Any, res: Any) -> bool:
        """A failed node with code and a fixable error (a build error, a check's rejection, a wrong or imprecise
        result) gets a repair turn, at most `repairs` in a row and while it may be asked again."""
        node = self._nodes.get(payload.id) if isinstance(payload, Idea) else None
        if node is None or not node.future.done() or isinstance(node.future.result(), NoKernel):
            return False
        fixable = res.status in _BUILD or res.status in _WRONG
        return fixable and node.depth < self.config.repairs and node.rounds < self.config.rounds

    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """The candidate an idea's answer gave: sends the request if `chosen` did not, and waits for it, not
        much past the search's deadline."""
        node = self._nodes[payload.id]
        self._send(node)
        wait = None if self.calls.deadline is None else max(0.0, self.calls.deadline - time.monotonic()) + _GRACE_S
        try:
            return node.future.result(timeout=wait)
        except futures.TimeoutError:
            return NoKernel.because(self.backend, "no answer by the search's deadline", Status.PROVIDER_ERROR)

    def _send(self, node: _Node) -> None:
        if node.request is not None:
            request, node.request = node.request, None
            request()

    def observe(self, spec: TaskSpec, payload: Any, cand: Candidate, res: EvalResult) -> None:
        """What the search measured for a node: the lineage later prompts show."""
        tl = self._log(spec)
        node = self._nodes.get(payload.id) if isinstance(payload, Idea) else None
        if node is not None:
            node.result = res
        who = f"#{payload.id} {payload.kind}" if isinstance(payload, Idea) else f"recipe {payload}"
        tl.attempts.append(f"- {who}, code {cand.digest[:8]}: {_outcome(res)}")

    # -- requests -----------------------------------------------------------------------------------
    def _log(self, spec: TaskSpec) -> _TaskLog:
        return self._tasks.setdefault(spec.key, _TaskLog())

    def _new(self, kind: str, parent: _Node | None, future: Future[Candidate], note: str = "") -> Idea:
        idea = Idea(next(self._ids), kind, parent.idea.id if parent else None, note)
        self._nodes[idea.id] = _Node(idea, future)
        if parent is not None:
            parent.children.append(idea.id)
        return idea

    def _ask(self, spec: TaskSpec, kind: str, parent: _Node | None, variant: int) -> Idea:
        """An idea whose request is built and sent when the search chooses it (`chosen`), with the lineage
        known then."""
        future: Future[Candidate] = Future()
        idea = self._new(kind, parent, future)
        node = self._nodes[idea.id]
        node.depth = parent.depth + 1 if parent is not None and kind.startswith("repair") else 0

        def run() -> None:
            cand, summary = self._write([("user", self._prompt(spec, kind, parent, variant, node))])
            node.summary = summary
            future.set_result(cand)

        def never_sent(f: Future[None]) -> None:
            if f.cancelled() and not future.done():
                future.set_result(NoKernel.because(self.backend, "the search ended before the request was sent",
                                                   Status.NOT_ASKED))

        node.request = lambda: self._pool.submit(run).add_done_callback(never_sent)
        return idea

    def _write(self, messages: list[Message]) -> tuple[Candidate, str]:
        """Ask, parse, and give a malformed answer one repair turn; failures become NoKernel. The candidate
        names the stored calls it came from (`Candidate.llm_calls`: the search links them to its node)."""
        calls: list[int] = []
        cut: list[str] = []  # answers cut before their end (max_tokens, the size cap)

        def ask(msgs: list[Message]) -> str:
            try:
                answer = self.calls.ask(self.system, msgs)
            except LLMError as e:
                calls.extend([e.call_id] if e.call_id is not None else [])
                raise
            calls.extend([answer.call_id] if answer.call_id is not None else [])
            if answer.reply.truncated:
                cut.append(answer.reply.text)
            return answer.reply.text

        cand, summary = self._answer(messages, ask)
        if cut and isinstance(cand, NoKernel) and cand.status is Status.BAD_FORMAT:
            cand = NoKernel.because(self.backend, f"the answer was cut at max_tokens ({self.calls.max_tokens}) "
                                    f"or the size cap before it held usable code; {cand.reason}", Status.TRUNCATED)
        return replace(cand, llm_calls=tuple(calls)), summary

    def _answer(self, messages: list[Message], ask: Callable[[list[Message]], str]) -> tuple[Candidate, str]:
        try:
            text = ask(messages)
            try:
                return parse_answer(text, self.backend), prose(text)
            except Malformed as e:
                first = e
            log.info("malformed answer, one repair turn: %s", first)
            fix = render_prompt("repair-format", reason=first, backend=self.backend, lang=LANG[self.backend])
            quoted = quote(text)  # a 2 MB answer is not sent back whole
            messages = [*messages, ("assistant", Prompt(quoted, quoted)), ("user", fix)]
            text = ask(messages)
            try:
                return parse_answer(text, self.backend), prose(text)
            except Malformed as e:
                if e.candidate or first.candidate:  # code that broke a rule: the evaluator rejects it, with its status
                    return e.candidate or first.candidate, prose(text)  # type: ignore[return-value]
                return NoKernel.because(self.backend, f"malformed answer after one repair turn: {e}"), ""
        except LLMError as e:  # refusal, empty answer, provider failure, budget, replay miss: a failed node
            return NoKernel.because(self.backend, str(e), e.status), ""
        except Exception as e:  # noqa: BLE001 - a bug here must not crash the search either
            log.exception("LLM request failed")
            return NoKernel.because(self.backend, f"{type(e).__name__}: {e}"), ""

    def _prompt(self, spec: TaskSpec, kind: str, parent: _Node | None, variant: int, node: _Node) -> Prompt:
        tl = self._log(spec)
        stats = tl.stats
        common = {"task": task_context(spec, stats.eager_us, stats.floor_us), "device": device_facts(self.device),
                  "lineage": self._lineage(spec, parent, node), "lang": LANG[self.backend], "backend": self.backend}
        if kind == "first":
            hint = _FIRST_HINTS[variant % len(_FIRST_HINTS)]  # every first prompt its own: no two cached alike
            hint += f" (Attempt {variant + 1} at this task.)" if variant >= len(_FIRST_HINTS) else ""
            return render_prompt("first", **common, variation=hint)
        assert parent is not None and parent.result is not None
        res, code = parent.result, parent.future.result().source.strip()
        if kind == "repair-build":
            built = res.status is Status.BUILD_ERROR
            return render_prompt("repair-build", **common, code=code,
                          stage="by the compiler" if built else "before building, by the static checks",
                          what="The compiler said" if built else "The checks said",
                          log=clean_log(without_report(res.build_log) if built else res.message))
        if kind == "repair-wrong":
            found = res.verify.get("mismatch") or (res.verify.get("timed") or {}).get("mismatch")
            return render_prompt("repair-wrong", **common, code=code, status=res.status.value,
                          summary=measured_numbers(clean_log(res.message) or "no detail"),
                          mismatch=measured_numbers(Mismatch.from_dict(found).describe()) if found else "")
        t = res.timing.median_us if res.timing else None
        floor = stats.floor_us
        best = f"{measured(f'{stats.best_us:.2f}')} us" if stats.best and stats.best_us else "this one"
        if stats.best and stats.best_us and stats.best.source.strip() != code:
            best += f":\n\n```{LANG[self.backend]}\n{stats.best.source.strip()}\n```"
        return render_prompt("optimize", **common, code=code, best=best, report=compiler_report(res.build_log),
                      traffic=throughput(spec.floor_bytes, floor, t), time_us=measured(f"{t:.2f}" if t else "?"),
                      percent=measured(f"{100 * floor / t:.0f}" if floor and t else "?"),
                      variation=_OPT_HINTS[variant % len(_OPT_HINTS)])

    def _lineage(self, spec: TaskSpec, parent: _Node | None, node: _Node) -> dict[str, Any]:
        """The parent and its other children (code digest, outcome, timing) and the task's recent attempts."""
        siblings = [self._nodes[c] for c in (parent.children if parent else []) if c != node.idea.id]
        return {"parent": self._describe(parent) if parent else "",
                "siblings": [self._describe(n) for n in siblings if n.result is not None],
                "recent": self._log(spec).attempts[-6:]}

    def _describe(self, n: _Node) -> str:
        """One node as the lineage shows it: id, kind, code digest, outcome with timing, the model's words."""
        cand = n.future.result() if n.future.done() else None
        digest = f", code {cand.digest[:8]}" if cand is not None and not isinstance(cand, NoKernel) else ""
        words = f" (approach: {n.summary})" if n.summary else ""
        return f"#{n.idea.id} {n.idea.kind}{digest}: {_outcome(n.result)}{words}"

    # -- mixing with recipes ------------------------------------------------------------------------
    def tunes(self, spec: TaskSpec, node: _Node) -> list[Idea]:
        """Knob changes of a correct kernel (doubled/halved FORGE_KNOB_ constants, fast-math)."""
        tl = self._log(spec)
        out = []
        for note, cand in variants(node.future.result()):
            if cand.digest not in tl.digests:
                tl.digests.add(cand.digest)
                done: Future[Candidate] = Future()
                done.set_result(cand)
                out.append(self._new("tune", node, done, note))
        return out

    def seeded(self, spec: TaskSpec, cand: Candidate, res: EvalResult) -> list[Idea]:
        """Optimize requests that start from a kernel written elsewhere (the recipes' best)."""
        done: Future[Candidate] = Future()
        done.set_result(cand)
        seed = self._nodes[self._new("seed", None, done).id]
        seed.result = res
        return [self._ask(spec, "optimize", seed, i) for i in range(self.config.optimize)]


def _outcome(res: EvalResult | None) -> str:
    if res is None:
        return "not evaluated"
    if res.status.passed and res.timing:
        return f"ok, {measured(f'{res.timing.median_us:.2f}')} us" + (
            f" ({measured(f'{res.speedup:.2f}')}x eager)" if res.speedup else "")
    first = clean_log(res.message).splitlines()[0][:200] if res.message.strip() else ""
    return f"{res.status.value}: {measured_numbers(first)}"



def clean_log(text: str, limit: int = 4000) -> str:
    """A build log as the model sees it: no command line, build folders cut to the file name, the tail."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("$ ")]
    return re.sub(r"(?:/[^\s:]+)?/(kernel\.\w+)", r"\1", "\n".join(lines)).strip()[-limit:]
