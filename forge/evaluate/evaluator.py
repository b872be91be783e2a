"""Evaluation of candidates: static checks -> build (parallel, cached) -> verify and bench in workers.

`Evaluator.evaluate_many` builds a batch on all CPU cores at once while the device workers (one per GPU with
`workers=N` on CUDA, N CPU workers on the CPU; forge.evaluate.pool) verify and time the ones already built,
each worker one candidate at a time. forge.evaluate.cluster's RayEvaluator is the same on a Ray cluster.
Every failure is an EvalResult with its status.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from forge.bench import DEFAULT_BENCH, BenchConfig
from forge.errors import UserError
from forge.evaluate.autotune import Tuned, autotune_once, kernel_names
from forge.evaluate.build import BuildPool, BuildResult
from forge.evaluate.checks import check
from forge.evaluate.devices import device_arch, device_model
from forge.evaluate.elfcheck import check_library
from forge.evaluate.live import call_once
from forge.evaluate.measured import measure_ahead
from forge.evaluate.parent import Worker
from forge.evaluate.pool import Slots, devices_for
from forge.evaluate.steps import EvalRequest
from forge.kernel import Candidate, EvalResult, NoKernel, Status, TaskSpec

log = logging.getLogger(__name__)


def default_memory(device: str) -> int | None:
    """A CPU worker's address-space limit: half the machine's memory, at least 4 GiB; none on CUDA."""
    if device != "cpu":
        return None
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(4 << 30, pages // 2)


def judge_built(worker: Worker, task: TaskSpec, cand: Candidate, built: BuildResult, seed: int,
                bench: BenchConfig | None, timeout_s: float, retime: bool = False) -> EvalResult:
    """One built candidate verified and timed (or only timed again, `retime`) in `worker`; a result always."""
    device = worker.device
    if not built.ok:
        return EvalResult(Status.BUILD_ERROR, first_error(built.log), build_log=built.log,
                          build_s=built.seconds, device=device)
    found = check_library(built.path, cand.backend)  # on the binary: what the source text could hide
    if found:
        return EvalResult(found[0][0], "; ".join(m for _, m in found)[:2000], build_log=built.log,
                          build_s=built.seconds, device=device)
    req = EvalRequest(task, cand.backend, built.path, cand.entry, seed, bench,
                      floor_factor=0.8 if device.startswith("cuda") else 0.25, retime=retime)
    return _with_build(worker.request(req, timeout_s), built)


class BaseEvaluator(ABC):
    """Judges candidates of tasks; `submit` says where (this host's workers, or a Ray cluster's actors)."""

    device: str  # where results are judged ("cpu", "cuda:0")
    device_model: str  # what they are tuned on (forge.evaluate.devices.device_model)
    arch: str | None  # what native candidates are built for
    cache_dir: Path | None  # of builds on this host (winners are built there)
    seed: int | None
    bench: BenchConfig | None

    @property
    @abstractmethod
    def parallel(self) -> int:
        """Candidates it judges at once: the search selects at least this many a batch."""

    @abstractmethod
    def submit(self, task: TaskSpec, cand: Candidate, seed: int, bench: BenchConfig | None,
               retime: bool = False) -> cf.Future[EvalResult]:
        """Build `cand` and judge it (verify and time, or only time again) on the next free worker."""

    def autotune(self, task: TaskSpec, cand: Candidate, effort: str, budget_s: int) -> Tuned:
        """Helion's autotuner on a Helion candidate (forge.evaluate.autotune): the candidate with the configs it
        chose, unjudged; this evaluator's answer when it cannot."""
        return Tuned(None, 0.0, f"{type(self).__name__} does not run Helion's autotuner")

    @abstractmethod
    def close(self) -> None:
        """Stop the workers and the builds."""

    def evaluate(self, task: TaskSpec, cand: Candidate, seed: int | None = None) -> EvalResult:
        """One candidate through checks, build, verification and timing."""
        return next(self.evaluate_many(task, [cand], seed))

    def evaluate_many(self, task: TaskSpec, cands: list[Candidate], seed: int | None = None
                      ) -> Iterator[EvalResult]:
        """Results in the order of `cands`; builds run in parallel ahead of the workers, which judge as many at
        once as there are. `seed`: of the verification inputs (the i-th candidate gets seed + i; default: the
        evaluator's); without either, a secret random one per evaluation, so that a candidate cannot recognise
        the inputs it is judged on."""
        seed = self.seed if seed is None else seed
        pending: list[EvalResult | cf.Future[EvalResult]] = []
        for i, c in enumerate(cands):
            problems = [(c.status, c.reason)] if isinstance(c, NoKernel) else check(c)
            if problems:
                pending.append(EvalResult(problems[0][0], "; ".join(m for _, m in problems), device=self.device))
                continue
            pending.append(self.submit(task, c, secrets.randbits(40) if seed is None else seed + i, self.bench))
        for p in pending:
            yield p if isinstance(p, EvalResult) else p.result()

    def retime(self, task: TaskSpec, cand: Candidate, bench: BenchConfig, seed: int | None = None) -> EvalResult:
        """Time an evaluated candidate again against eager with `bench` (its build is cached): no verification
        but of the calls kept while timing; a failure is a result, as in `evaluate`."""
        seed = seed if seed is not None else self.seed if self.seed is not None else secrets.randbits(40)
        return self.submit(task, cand, seed, bench, retime=True).result()

    def __enter__(self) -> BaseEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Evaluator(BaseEvaluator):
    """Judges candidates for tasks on one device, or on `workers` of them (one per GPU; CPU: N workers)."""

    def __init__(self, device: str = "cpu", *, workers: int = 1, cache_dir: Path | None = None,
                 build_workers: int | None = None, timeout_s: float = 120.0, bench: BenchConfig | None = DEFAULT_BENCH,
                 memory_bytes: int | None = None, arch: str | None = None, seed: int | None = None) -> None:
        """`seed`: the verification inputs' seed for every evaluation that names none (reproducible runs, as
        tests need); by default a secret random one per evaluation. `workers`: worker processes, each pinned
        to its own GPU (cuda:0..N-1 with CUDA_VISIBLE_DEVICES) or, on the CPU, N CPU workers."""
        devices = devices_for(device, workers)
        self.device = devices[0]
        self.seed = seed
        self.timeout_s = timeout_s
        self.bench = bench
        self.arch = arch or device_arch(self.device)
        self.cache_dir = cache_dir  # of builds (None: forge.evaluate.build.default_cache_dir); winners go there too
        models = {device_model(d) for d in devices} if len(devices) > 1 else set()
        if len(models) > 1:  # speedups are compared across the workers: they must be timed on one GPU model
            raise UserError(f"the GPUs differ ({', '.join(sorted(models))}): pick one model's with "
                            "CUDA_VISIBLE_DEVICES")
        self.device_model = device_model(self.device)  # what its results (and the run's kernels) are tuned on
        self.builds = BuildPool(build_workers, self.arch, cache_dir)
        memory = memory_bytes if memory_bytes is not None else default_memory(self.device)
        # with several workers, each compiles Triton kernels into a cache folder of its own
        self.workers = [Worker(d, memory if d == "cpu" else None, triton_cache=f"worker-{i}" if len(devices) > 1
                               else None) for i, d in enumerate(devices)]
        self.slots: Slots[int] = Slots(range(len(self.workers)))  # a slot: an index into self.workers
        for _ in self.workers:  # the worker processes start on their slots while the first candidates build
            self.slots.submit(self._start_worker)
        self._measuring = measure_ahead([w.device for w in self.workers])  # the judge's copy rate, meanwhile

    def _start_worker(self, i: int) -> None:
        """Start worker i ahead of its first step; a start that fails is left to that step, which starts it
        again and reports the failure as its candidate's result."""
        try:
            self.workers[i].start()
        except Exception as e:  # noqa: BLE001 - nobody reads this job's future: said here, reported by the step
            log.warning("the %s worker did not start ahead of its first step: %s", self.workers[i].device, e)

    @property
    def worker(self) -> Worker:
        """The first worker (the only one with workers=1)."""
        return self.workers[0]

    @worker.setter
    def worker(self, w: Worker) -> None:
        self.workers[0] = w

    @property
    def parallel(self) -> int:
        """One candidate at a time per worker."""
        return len(self.slots)

    def submit(self, task: TaskSpec, cand: Candidate, seed: int, bench: BenchConfig | None,
               retime: bool = False) -> cf.Future[EvalResult]:
        """Build `cand` (on the CPU cores) and judge it on the next free worker once built."""
        built = self.builds.submit(cand)

        def job(i: int) -> EvalResult:
            return judge_built(self.workers[i], task, cand, built.result(), seed, bench, self.timeout_s, retime)

        return self.slots.submit(job, ready=built.result)

    def close(self) -> None:
        """Stop the workers and the build threads."""
        self.slots.close()
        for w in self.workers:
            w.close()
        self.builds.close()
        self._measuring.join()  # at most the copies' second: not torn down mid-copy when the process exits

    def _built(self, cand: Candidate) -> BuildResult | EvalResult:
        """`cand` checked, built (cached) and its library checked; the failure as an EvalResult."""
        problems = check(cand)
        if problems:
            return EvalResult(problems[0][0], "; ".join(m for _, m in problems), device=self.device)
        built = self.builds.submit(cand).result()
        if not built.ok:
            return EvalResult(Status.BUILD_ERROR, first_error(built.log), build_log=built.log, device=self.device)
        found = check_library(built.path, cand.backend)
        if found:
            return EvalResult(found[0][0], "; ".join(m for _, m in found)[:2000], device=self.device)
        return built

    def call(self, task: TaskSpec, cand: Candidate, inputs: list[Any]) -> tuple[Any, ...] | EvalResult:
        """The outputs of one call of a candidate (built, cached) on these inputs, on the next free worker; no
        verdict: forge lab runs a verified kernel on a person's own inputs so. A failure is an EvalResult."""
        built = self._built(cand)
        if isinstance(built, EvalResult):
            return built
        job = self.slots.submit(lambda i: call_once(self.workers[i], task, cand.backend, built.path, cand.entry,
                                                    inputs, self.timeout_s))
        return job.result()  # on a judging slot: never at once with another candidate on that worker

    def autotune(self, task: TaskSpec, cand: Candidate, effort: str, budget_s: int) -> Tuned:
        """Build `cand` and run Helion's autotuner on it in the worker for Python candidates, on a judging slot."""
        built = self._built(cand)
        if isinstance(built, EvalResult):
            return Tuned(None, 0.0, f"{built.status.value}: {built.message}"[:400])
        # a kernel at a time, each within its budget, plus Helion's start and the compiles it finishes
        limit = 30.0 + 1.5 * budget_s * max(1, len(kernel_names(cand.source)))
        job = self.slots.submit(lambda i: autotune_once(self.workers[i], task, cand, built.path, effort, budget_s,
                                                        limit))
        return job.result()


def first_error(log_text: str) -> str:
    """The first line of a compiler log that names an error (else its last line)."""
    for line in log_text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log_text.strip().splitlines() or ["build failed"])[-1][:300]


def _with_build(res: EvalResult, built: BuildResult) -> EvalResult:
    return replace(res, build_log=built.log, build_s=built.seconds)
