"""The late verification's settle: an output written after the call returned (work left on a thread) fails
as forbidden_concurrency whichever set it is, with the sets placed together or one at a time; a kernel that is
done when it returns passes. The target is this process (forge.evaluate.verify's Target interface): the corpus's
thread kernels never get this far, the static and library checks stop them first."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

import forge.evaluate.verify as verify_module
from forge.capture.export import TensorMeta, capture
from forge.evaluate.remote import Rejected
from forge.evaluate.verify import SETS, Reference, Target, verify
from forge.kernel import EvalResult, Status, TaskSpec
from forge.tasks.cut import build_tasks


class LateWriter(Target):
    """SiLU computed in the call; on call number `late` a thread changes the output 20 ms after it returned."""

    def __init__(self, late: int | None) -> None:
        self.late, self.calls, self.places, self.threads = late, 0, 0, []

    def place(self, inputs: Sequence[TensorMeta], buffers: Sequence[tuple[int, torch.dtype]]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        self.places += 1
        ins = [torch.empty(m.numel, dtype=m.torch_dtype).as_strided(m.shape, m.stride) for m in inputs]
        return ins, [torch.empty(n, dtype=d) for n, d in buffers]

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0].copy_(torch.nn.functional.silu(inputs[0]))
        if self.calls == self.late:
            out = outputs[0]
            t = threading.Timer(0.02, lambda: out.add_(1.0))
            t.start()
            self.threads.append(t)
        self.calls += 1

    def sync(self) -> None:
        pass


def _placing(monkeypatch: pytest.MonkeyPatch, together: bool) -> None:
    """The sets placed together (the default for small tasks) or each alone (as tasks over TOGETHER_BYTES are)."""
    if not together:
        monkeypatch.setattr(verify_module, "TOGETHER_BYTES", 0)


def _died() -> Rejected:
    """What a call whose worker died raises (forge.evaluate.remote.Remote.step)."""
    return Rejected(EvalResult(Status.CRASH, "died", device="cpu"))


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    (task,) = build_tasks(capture(torch.nn.SiLU(), [torch.randn(64, 100)]).graph_module.graph)
    return TaskSpec.of(task)


def _late(spec: TaskSpec, target: LateWriter):
    v = verify(target, Reference(spec.source), spec.inputs, spec.outputs, "cpu", 7, settle_s=0.2, finite_fill=True)
    for t in target.threads:
        t.join()
    return v


@pytest.mark.parametrize("together", [True, False])
@pytest.mark.parametrize("late", [0, SETS - 1])
def test_an_output_written_after_the_call_returned_fails(spec: TaskSpec, late: int, together: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    target = LateWriter(late)
    v = _late(spec, target)
    assert v.status is Status.FORBIDDEN_CONCURRENCY, v.message
    assert v.message.startswith(f"set {late}:")
    # together: one place for all the sets, the write found after the last call; alone: a place a set, found
    # before the next set is called
    assert (target.places, target.calls) == ((1, SETS) if together else (late + 1, late + 1))


@pytest.mark.parametrize("together", [True, False])
def test_a_kernel_done_when_it_returns_passes(spec: TaskSpec, together: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    target = LateWriter(None)
    v = _late(spec, target)
    assert v.status is Status.OK, v.message
    assert (target.places, target.calls) == ((1 if together else SETS), SETS)


class Undone(LateWriter):
    """Returns without computing; its "thread" writes the right values while the judge computes the reference
    and puts back what the call had left just before the settle's compare: what is judged must be what the call
    left when it returned, not what the buffers hold later."""

    def __init__(self) -> None:
        super().__init__(None)
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        self.calls += 1
        self.pending.append((inputs[0], outputs[0], outputs[0].clone()))

    def right_now(self) -> None:
        for x, out, _ in self.pending:
            out.copy_(torch.nn.functional.silu(x))

    def as_returned(self) -> None:
        for _, out, returned in self.pending:
            out.copy_(returned)


@pytest.mark.parametrize(("settle_s", "together"), [(0.0, False), (0.02, False), (0.02, True)])
def test_outputs_are_judged_as_the_call_left_them(spec: TaskSpec, together: bool, settle_s: float,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    target, ref = Undone(), Reference(spec.source)
    high = ref.high

    def high_while_the_thread_writes(*xs: torch.Tensor) -> object:
        target.right_now()
        return high(*xs)

    monkeypatch.setattr(ref, "high", high_while_the_thread_writes)
    sleep = verify_module.time.sleep

    def restored_before_the_compare(s: float) -> None:
        target.as_returned()
        sleep(s)

    monkeypatch.setattr(verify_module.time, "sleep", restored_before_the_compare)
    v = verify(target, ref, spec.inputs, spec.outputs, "cpu", 3, settle_s=settle_s, finite_fill=True,
               kinds=(0, SETS - 1))
    assert v.status is Status.WRONG_RESULT, v.message


class WrongThenCrash(LateWriter):
    """Wrong on the first set, dies on the second: the first set's failure is the verdict, as it would be with
    the sets judged one at a time."""

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        self.calls += 1
        if self.calls > 1:
            raise _died()
        outputs[0].copy_(torch.nn.functional.silu(inputs[0]) + 1)


@pytest.mark.parametrize("together", [True, False])
def test_a_set_that_failed_before_a_call_that_died_is_the_verdict(spec: TaskSpec, together: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    v = verify(WrongThenCrash(None), Reference(spec.source), spec.inputs, spec.outputs, "cpu", 3, settle_s=0.02,
               finite_fill=True, kinds=(0, SETS - 1))
    assert v.status is Status.WRONG_RESULT, v.message


class InputWriter(LateWriter):
    """Right when it returns, but leaves a thread that doubles its input 5 ms later."""

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        outputs[0].copy_(torch.nn.functional.silu(inputs[0]))
        x = inputs[0]
        t = threading.Timer(0.005, lambda: x.mul_(2.0))
        t.start()
        self.threads.append(t)
        self.calls += 1


@pytest.mark.parametrize("together", [True, False])
def test_an_input_written_after_the_call_returned_fails(spec: TaskSpec, together: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    v = _late(spec, InputWriter(None))
    assert v.status is Status.INPUT_MUTATED and "after the call returned" in v.message, v.message


class ChangeThenCrash(LateWriter):
    """Right on the first set but its thread changes that output 5 ms later; dies on the second call."""

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        self.calls += 1
        if self.calls > 1:
            raise _died()
        outputs[0].copy_(torch.nn.functional.silu(inputs[0]))
        out = outputs[0]
        t = threading.Timer(0.005, lambda: out.add_(1.0))
        t.start()
        self.threads.append(t)


@pytest.mark.parametrize("together", [True, False])
def test_a_change_before_a_call_that_died_is_the_verdict(spec: TaskSpec, together: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _placing(monkeypatch, together)
    v = _late(spec, ChangeThenCrash(None))
    assert v.status is Status.FORBIDDEN_CONCURRENCY, v.message
