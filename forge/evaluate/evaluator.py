"""Evaluation of candidates: static checks -> build (parallel, cached) -> verify and bench in a worker.

`Evaluator.evaluate_many` builds a batch on all CPU cores at once while the device worker verifies and
times the ones already built, one at a time. Every failure is an EvalResult with its status.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from forge.bench import DEFAULT_BENCH, BenchConfig
from forge.evaluate.build import BuildPool, BuildResult
from forge.evaluate.checks import check
from forge.evaluate.elfcheck import check_library
from forge.evaluate.live import call_once
from forge.evaluate.parent import Worker
from forge.evaluate.steps import EvalRequest
from forge.kernel import Candidate, EvalResult, NoKernel, Status, TaskSpec

log = logging.getLogger(__name__)


def device_arch(device: str) -> str | None:
    """The nvcc architecture of a CUDA device ("sm_90"), asked of torch in this process (no context)."""
    if not device.startswith("cuda"):
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class Evaluator:
    """Judges candidates for tasks on one device."""

    def __init__(self, device: str = "cpu", *, cache_dir: Path | None = None, build_workers: int | None = None,
                 timeout_s: float = 120.0, bench: BenchConfig | None = DEFAULT_BENCH,
                 memory_bytes: int | None = None, arch: str | None = None, seed: int | None = None) -> None:
        """`seed`: the verification inputs' seed for every evaluation that names none (reproducible runs, as
        tests need); by default a secret random one per evaluation."""
        self.device = device
        self.seed = seed
        self.timeout_s = timeout_s
        self.bench = bench
        self.arch = arch or device_arch(device)
        self.cache_dir = cache_dir  # of builds (None: forge.evaluate.build.default_cache_dir); winners go there too
        self.builds = BuildPool(build_workers, self.arch, cache_dir)
        if memory_bytes is None and device == "cpu":
            pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            memory_bytes = max(4 << 30, pages // 2)
        self.worker = Worker(device, memory_bytes if device == "cpu" else None)

    def _judge(self, task: TaskSpec, cand: Candidate, built: BuildResult, seed: int) -> EvalResult:
        if not built.ok:
            return EvalResult(Status.BUILD_ERROR, _first_error(built.log), build_log=built.log,
                              build_s=built.seconds, device=self.device)
        found = check_library(built.path, cand.backend)  # on the binary: what the source text could hide
        if found:
            return EvalResult(found[0][0], "; ".join(m for _, m in found)[:2000], build_log=built.log,
                              build_s=built.seconds, device=self.device)
        req = EvalRequest(task, cand.backend, built.path, cand.entry, seed, self.bench,
                          floor_factor=0.8 if self.device.startswith("cuda") else 0.25)
        res = self.worker.request(req, self.timeout_s)
        return _with_build(res, built)

    def evaluate(self, task: TaskSpec, cand: Candidate, seed: int | None = None) -> EvalResult:
        """One candidate through checks, build, verification and timing."""
        return next(self.evaluate_many(task, [cand], seed))

    def evaluate_many(self, task: TaskSpec, cands: list[Candidate], seed: int | None = None
                      ) -> Iterator[EvalResult]:
        """Results in the order of `cands`; builds run in parallel ahead of the worker. `seed`: of the
        verification inputs (the i-th candidate gets seed + i; default: the evaluator's); without either, a
        secret random one per evaluation, so that a candidate cannot recognise the inputs it is judged on."""
        seed = self.seed if seed is None else seed
        futures = []
        for c in cands:
            problems = [(c.status, c.reason)] if isinstance(c, NoKernel) else check(c)
            futures.append(problems if problems else self.builds.submit(c))
        for i, (c, f) in enumerate(zip(cands, futures, strict=True)):
            if isinstance(f, list):
                status, _ = f[0]
                yield EvalResult(status, "; ".join(m for _, m in f), device=self.device)
                continue
            yield self._judge(task, c, f.result(), secrets.randbits(40) if seed is None else seed + i)

    def retime(self, task: TaskSpec, cand: Candidate, bench: BenchConfig, seed: int | None = None) -> EvalResult:
        """Time an evaluated candidate again against eager with `bench` (its build is cached): no verification
        but of the calls kept while timing; a failure is a result, as in `evaluate`."""
        built = self.builds.submit(cand).result()
        if not built.ok:
            return EvalResult(Status.BUILD_ERROR, _first_error(built.log), build_log=built.log, device=self.device)
        seed = seed if seed is not None else self.seed if self.seed is not None else secrets.randbits(40)
        req = EvalRequest(task, cand.backend, built.path, cand.entry, seed, bench, retime=True)
        return _with_build(self.worker.request(req, self.timeout_s), built)

    def call(self, task: TaskSpec, cand: Candidate, inputs: list[Any]) -> tuple[Any, ...] | EvalResult:
        """The outputs of one call of a candidate (built, cached) on these inputs, in the worker; no verdict:
        forge lab runs a verified kernel on a person's own inputs so. A failure is an EvalResult."""
        problems = check(cand)
        if problems:
            return EvalResult(problems[0][0], "; ".join(m for _, m in problems), device=self.device)
        built = self.builds.submit(cand).result()
        if not built.ok:
            return EvalResult(Status.BUILD_ERROR, _first_error(built.log), build_log=built.log, device=self.device)
        found = check_library(built.path, cand.backend)
        if found:
            return EvalResult(found[0][0], "; ".join(m for _, m in found)[:2000], device=self.device)
        return call_once(self.worker, task, cand.backend, built.path, cand.entry, inputs, self.timeout_s)

    def close(self) -> None:
        """Stop the worker and the build threads."""
        self.worker.close()
        self.builds.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_error(log_text: str) -> str:
    for line in log_text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log_text.strip().splitlines() or ["build failed"])[-1][:300]


def _with_build(res: EvalResult, built: BuildResult) -> EvalResult:
    return replace(res, build_log=built.log, build_s=built.seconds)
