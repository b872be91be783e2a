"""The worker process: loads a built candidate and runs it on what the judge gives it, one step at a time.

Started by forge.evaluate.parent.Worker as `python -m forge.evaluate.child FD_IN FD_OUT DEVICE [confine]`, with
an environment by allowlist, in a temporary directory, with its stdout/stderr in a log file. Messages are
frozen dataclasses sent over a pipe (never tensors): tensors live in the arena the judge shares
(forge.evaluate.arena). Anything the candidate does that kills the process (segfault, abort, illegal address) or
hangs it is handled by the parent.

Important: this is the only process that runs candidate code, and it holds nothing that decides the
verdict: it never sees the reference in higher precision, computes no error and judges nothing
(forge.evaluate.judge, in forge's own process, does). It runs the task's eager code only as the baseline it times
the candidate against, and the judge checks both times against its own clock. A confined worker (CPU
workers; CUDA workers but the one for Python candidates) installs its seccomp filter before its first message
(forge.evaluate.confine).
"""

from __future__ import annotations

import importlib
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from forge.backends import BACKENDS
from forge.bench import Clock, interleaved
from forge.evaluate import devmem
from forge.evaluate.arena import ArenaError, Mapped
from forge.evaluate.confine import available as confine_available
from forge.evaluate.confine import confine
from forge.evaluate.domains import input_domains
from forge.evaluate.launch import ForbiddenTorch, Launcher, LaunchError, call_on
from forge.evaluate.sandbox import nondumpable
from forge.evaluate.spotcheck import SpotCheck
from forge.evaluate.steps import Call, Load, Reply, Time, Tune
from forge.kernel import Status
from forge.tasks.cut import compile_source


class _State:
    def __init__(self, device: str, shares: socket.socket | None = None) -> None:
        self.device = device
        self.shares = shares  # CUDA: where the judge sends the arena's descriptors (forge.evaluate.devmem)
        self.clock: Clock | None = None
        self.launcher: Launcher | None = None
        self.load: Load | None = None
        self.eager: Callable[..., Any] | None = None

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()


def _is_cuda_fault(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in ("illegal memory access", "CUDA error", "misaligned address",
                                   "unspecified launch failure", "illegal instruction", "device-side assert"))


def _load(msg: Load, st: _State) -> Reply:
    st.launcher, st.load, st.eager = None, msg, None
    try:
        st.eager = compile_source(msg.task.source)
    except Exception as e:
        return Reply(Status.REFERENCE_ERROR, f"{type(e).__name__}: {e}")
    st.launcher = Launcher(msg.backend, msg.path, msg.entry)
    return Reply()


def _call(msg: Call, st: _State) -> Reply:
    assert st.launcher is not None, "Load first"
    mapped = Mapped(msg.arena, st.shares)
    try:
        call = st.launcher.bind(mapped.views(msg.inputs), mapped.views(msg.outputs), guard=msg.guard)
        protected = msg.readonly and mapped.protect(msg.inputs, writable=False)
        try:
            call()
            st.sync()
        finally:
            if protected:
                mapped.protect(msg.inputs, writable=True)
    finally:
        mapped.close()
    return Reply()


def _time(msg: Time, st: _State) -> Reply:
    assert st.launcher is not None and st.load is not None and st.eager is not None, "Load first"
    task, eager = st.load.task, st.eager
    mapped = Mapped(msg.arena, st.shares)
    try:
        inputs = mapped.views(msg.inputs)
        # Every timed call into fresh outputs (a fair clock, as eager and the dispatcher have), on inputs
        # perturbed before each round; random calls kept for the judge (forge.evaluate.spotcheck).
        spot = SpotCheck(inputs, task.outputs, msg.batch or msg.bench.min_runs, st.device, input_domains(task.source),
                         msg.renew)
        spot.limit = min(spot.limit, len(msg.kept))
        cand = spot.wrap(call_on(st.launcher, task.inputs, task.outputs))
        timing = baseline = None
        with torch.no_grad():
            if msg.batch:
                for _ in range(msg.batch):
                    spot.prepare(True)
                    cand()
                st.sync()
            else:
                if st.clock is None:
                    st.clock = Clock(st.device)
                timing, baseline = interleaved(st.clock, [cand, lambda: eager(*inputs)], msg.bench, spot.prepare)
        kept = spot.store([(mapped.views(i), mapped.views(o)) for i, o in msg.kept])
        st.sync()
        return Reply(timing=timing, baseline=baseline, kept=kept)
    finally:
        mapped.close()


def _tune(msg: Tune, st: _State) -> Reply:
    assert st.launcher is not None and st.load is not None, "Load first"
    if not BACKENDS[st.load.backend].autotunes:
        return Reply(Status.LAUNCH_ERROR, f"only Helion candidates are autotuned, not {st.load.backend}")
    from forge.evaluate.helion_tune import autotune

    mapped = Mapped(msg.arena, st.shares)
    try:
        found = autotune(st.launcher.module, st.launcher.py_fn, mapped.views(msg.inputs), mapped.views(msg.outputs),
                         msg.effort, msg.budget_s)
        st.sync()
        return Reply(message=found, fatal=True)  # a fresh worker judges what follows, without the tuner's state
    finally:
        mapped.close()


_STEPS: dict[type, Callable[[Any, _State], Reply]] = {Load: _load, Call: _call, Time: _time, Tune: _tune}


def handle(msg: Load | Call | Time | Tune, st: _State) -> Reply:
    """One step -> its reply; failures are replies with their status."""
    try:
        return _STEPS[type(msg)](msg, st)
    except ArenaError as e:  # a fresh worker gets the arena again
        return Reply(Status.CRASH, f"the worker could not map the arena: {e}"[:500], fatal=True)
    except ForbiddenTorch as e:
        return Reply(Status.FORBIDDEN_TORCH, str(e))
    except LaunchError as e:
        return Reply(Status.LAUNCH_ERROR, str(e))
    except (torch.OutOfMemoryError, MemoryError) as e:
        return Reply(Status.OUT_OF_MEMORY, f"{type(e).__name__}: {str(e)[:300]}")
    except Exception as e:
        if st.device.startswith("cuda") and _is_cuda_fault(e):
            return Reply(Status.CRASH, f"CUDA fault: {str(e).strip().splitlines()[0]}", fatal=True)
        return Reply(Status.LAUNCH_ERROR, f"{type(e).__name__}: {str(e)[:500]}")


def _preload(modules: list[str]) -> None:
    """Import the libraries whose functions the tasks' references call (a scan's, forge.capture.scans), before
    the filter: importing one later takes system calls it kills (glibc's user lookup opens a socket)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # the reference then fails on its own, as a reference error
            print(f"forge worker: could not import {name}: {type(e).__name__}: {e}", flush=True)


def main(argv: list[str]) -> int:
    """Serve steps until the parent closes the pipe. argv: FD_IN FD_OUT DEVICE [confine] [private] [preload=M1,M2]
    [shares=FD] (a CUDA worker's socket for its arena, forge.evaluate.devmem):
    with `confine`, the worker installs forge.evaluate.confine's seccomp filter on itself before the first step,
    once everything it needs is imported (the modules of `preload` too) and initialised, and tells the parent
    whether it could ("ready", reason or ""); with `private` (a worker that gave up root), it makes itself
    non-dumpable first, so that other processes of its user (other workers) cannot read its memory."""
    fd_in, fd_out, device = int(argv[0]), int(argv[1]), argv[2]
    _preload([m for a in argv[3:] if a.startswith("preload=") for m in a.removeprefix("preload=").split(",") if m])
    conn_in, conn_out = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    if "private" in argv[3:]:
        nondumpable()
    if device.startswith("cuda"):
        torch.cuda.init()
        devmem.ready()
    shares = [int(a.removeprefix("shares=")) for a in argv[3:] if a.startswith("shares=")]
    st = _State(device, socket.socket(fileno=shares[0]) if shares else None)
    if st.shares is not None:
        st.shares.settimeout(60.0)  # the descriptor comes before its step: never wait on one that does not
    unconfined = ""
    if "confine" in argv[3:]:
        unconfined = confine_available()
        if not unconfined:
            torch.empty(1, device=device).add_(1)  # the allocator and the thread pool before the filter
            confine(cuda=device.startswith("cuda"))
    conn_out.send(("ready", unconfined))
    while True:
        try:
            msg = conn_in.recv()
        except EOFError:
            return 0
        start = time.perf_counter()
        reply = handle(msg, st)
        conn_out.send((reply, time.perf_counter() - start))
        if reply.fatal:
            return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
