"""The worker process: loads a built candidate, verifies it and benchmarks it, one request at a time.

Started by forge.workers.Worker as `python -m forge.worker FD_IN FD_OUT DEVICE`, with an environment
without credentials, in a temporary directory, with its stdout/stderr in a log file. Requests and
results are frozen dataclasses sent over a pipe (never tensors). Anything the candidate does that kills
the process (segfault, abort, illegal address) or hangs it is handled by the parent.

Important: this is the only process that runs candidate code. A CPU worker confines itself with a seccomp
filter before its first request (forge.confine).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from forge.bench import DEFAULT_BENCH, BenchConfig, Clock, interleaved, measure_bandwidth
from forge.capture import TensorMeta
from forge.confine import available as confine_available
from forge.confine import confine
from forge.kernel import EvalResult, Status, TaskSpec
from forge.launch import ForbiddenTorch, Launcher, LaunchError, call_on
from forge.spotcheck import SpotCheck
from forge.verify import Reference, generator, make_input, verify


@dataclass(frozen=True)
class EvalRequest:
    """Verify (and, with `bench`, time) one built candidate of a task."""

    task: TaskSpec
    backend: str
    path: str  # the built library (cpu, cuda) or module (triton)
    entry: str
    seed: int = 0
    bench: BenchConfig | None = DEFAULT_BENCH
    floor_factor: float = 0.8  # reject below this fraction of the roofline floor


class _State:
    def __init__(self, device: str) -> None:
        self.device = device
        self.clock: Clock | None = None
        self.bandwidth: float | None = None

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()


def _is_cuda_fault(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in ("illegal memory access", "CUDA error", "misaligned address",
                                   "unspecified launch failure", "illegal instruction", "device-side assert"))


def _skips_repeats(launcher: Launcher, inputs: list[torch.Tensor], metas: tuple[TensorMeta, ...],
                   ref: Reference, st: _State) -> str:
    """Called twice on the same buffers, poisoned in between: what a kernel that skips work on a repeated
    call left unwritten (the allocator often hands a dispatched kernel the same output addresses), or ""."""
    outputs = [torch.empty(m.shape, dtype=m.torch_dtype, device=st.device) for m in metas]
    again = launcher.bind(inputs, outputs)
    again()
    st.sync()
    for o in outputs:
        o.fill_(float("nan") if o.is_floating_point() else 0x5A)
    again()
    st.sync()
    with torch.no_grad():
        eager_out = ref.eager(*inputs)
    for i, (o, e) in enumerate(zip(outputs, eager_out, strict=True)):
        if o.is_floating_point() and bool((o.isnan() & ~e.isnan()).any()):
            return f"output {i}: not written when called again on the same buffers (skips work on repeated calls)"
    return ""


def handle(req: EvalRequest, st: _State) -> tuple[EvalResult, bool]:
    """One request -> (result, fatal); fatal means the device context is broken and the worker must exit."""
    start = time.perf_counter()

    def result(status: Status, message: str = "", **kw: object) -> EvalResult:
        return EvalResult(status, message, device=st.device, device_s=time.perf_counter() - start, **kw)

    try:
        launcher = Launcher(req.backend, req.path, req.entry)
        try:
            ref = Reference(req.task.source)
        except Exception as e:
            return result(Status.REFERENCE_ERROR, f"{type(e).__name__}: {e}"), False
        verdict = verify(lambda i, o: launcher.bind(i, o, guard=True), ref, req.task.inputs, req.task.outputs,
                         st.device, req.seed, st.sync)
        if verdict.status is not Status.OK or req.bench is None:
            return result(verdict.status, verdict.message, verify=verdict.detail), False
        if st.clock is None:
            st.clock = Clock(st.device)
            st.bandwidth = measure_bandwidth(st.device)
        gen = generator(st.device, req.seed * 1000 + 7)
        inputs = [make_input(m, 0, gen, st.device) for m in req.task.inputs]
        skipped = _skips_repeats(launcher, inputs, req.task.outputs, ref, st)
        if skipped:
            return result(Status.STALE_RESULT, skipped, verify=verdict.detail), False
        # Every timed call into fresh outputs (a fair clock, as eager and the dispatcher have), on inputs
        # perturbed before each round; random calls kept and judged after timing (forge.spotcheck).
        spot = SpotCheck(inputs, req.task.outputs, req.bench.min_runs, st.device)
        cand, eager = spot.wrap(call_on(launcher, req.task.inputs, req.task.outputs)), ref.eager
        with torch.no_grad():
            timing, baseline = interleaved(st.clock, [cand, lambda: eager(*inputs)], req.bench, spot.prepare)
            wrong = spot.judge(ref)
        if wrong is not None:
            return result(wrong.status, wrong.message, verify={**verdict.detail, "timed": wrong.detail}), False
        # The calls judged are not only the first ones: the sets again, from a seed drawn here, after all
        # the timed calls, into outputs holding finite values (not the NaN poison a kernel could look for),
        # each output watched for a moment after its call returned.
        late = verify(lambda i, o: launcher.bind(i, o, guard=True), ref, req.task.inputs, req.task.outputs,
                      st.device, random.SystemRandom().getrandbits(40), st.sync, settle_s=0.02, finite_fill=True)
        if late.status is not Status.OK:
            return result(late.status, f"after timing: {late.message}", verify=verdict.detail), False
        floor_us = req.task.floor_bytes / st.bandwidth * 1e6 if st.bandwidth else None
        if floor_us and timing.median_us < req.floor_factor * floor_us:
            return result(Status.TOO_FAST, f"median {timing.median_us:.2f} us is below the roofline floor "
                          f"{floor_us:.2f} us ({req.task.floor_bytes} bytes at {st.bandwidth / 1e9:.0f} GB/s)",
                          verify=verdict.detail, timing=timing, baseline=baseline, floor_us=floor_us), False
        return result(Status.OK, "", verify=verdict.detail, timing=timing, baseline=baseline,
                      floor_us=floor_us), False
    except ForbiddenTorch as e:
        return result(Status.FORBIDDEN_TORCH, str(e)), False
    except LaunchError as e:
        return result(Status.LAUNCH_ERROR, str(e)), False
    except (torch.OutOfMemoryError, MemoryError) as e:
        return result(Status.OUT_OF_MEMORY, f"{type(e).__name__}: {str(e)[:300]}"), False
    except Exception as e:
        if st.device.startswith("cuda") and _is_cuda_fault(e):
            return result(Status.CRASH, f"CUDA fault: {str(e).strip().splitlines()[0]}"), True
        return result(Status.LAUNCH_ERROR, f"{type(e).__name__}: {str(e)[:500]}"), False


def main(argv: list[str]) -> int:
    """Serve requests until the parent closes the pipe. argv: FD_IN FD_OUT DEVICE [confine]: with `confine`,
    the worker installs forge.confine's seccomp filter on itself before the first request, once everything
    it needs is imported and initialised, and tells the parent whether it could ("ready", reason or "")."""
    fd_in, fd_out, device = int(argv[0]), int(argv[1]), argv[2]
    conn_in, conn_out = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    if device.startswith("cuda"):
        torch.cuda.init()
    st = _State(device)
    unconfined = ""
    if argv[3:] == ["confine"]:
        unconfined = confine_available()
        if not unconfined:
            torch.empty(1, device=device).add_(1)  # the allocator and the thread pool before the filter
            confine()
    conn_out.send(("ready", unconfined))
    while True:
        try:
            req = conn_in.recv()
        except EOFError:
            return 0
        res, fatal = handle(req, st)
        conn_out.send(res)
        if fatal:
            return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
