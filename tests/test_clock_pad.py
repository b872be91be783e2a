"""The clock beside a busy CPU: compilers run niced beside the worker that times candidates (forge.evaluate.build's
BUILD_NICE), and a Python launch path longer than the cache flush is not timed on the GPU (forge.bench's
PAD_US). What each is worth is benchmarks/launch_path.py's to measure, on the device (h200.md, 2026-12-07)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from forge.bench import PAD_US, BenchConfig, Clock, interleaved
from forge.evaluate.build import BUILD_NICE, _compile


def test_the_compilers_run_niced(tmp_path: Path) -> None:
    """A build's commands run at BUILD_NICE more than forge's niceness (at most 19): a real process, asked."""
    ok, log = _compile([[sys.executable, "-c", "import os; print('niceness', os.nice(0))"]], tmp_path, 60)
    assert ok, log
    assert f"niceness {min(19, os.nice(0) + BUILD_NICE)}" in log


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_launch_path_longer_than_the_flush_is_not_timed() -> None:
    """A call that spends 120 us on the CPU before its one small kernel: with the pad the GPU is still busy
    when the kernel is queued, so the time is the kernel's; with the flush alone (pad 0) the wait is timed."""
    x = torch.randn(1 << 16, device="cuda")

    def slow_launch() -> torch.Tensor:
        end = time.perf_counter() + 120e-6
        while time.perf_counter() < end:
            pass
        return x * 2

    cfg = BenchConfig(warmup_s=0.02, budget_s=0.2, min_runs=20, max_runs=100)
    (padded,) = interleaved(Clock("cuda"), [slow_launch], cfg)
    (flush_only,) = interleaved(Clock("cuda", pad_us=0), [slow_launch], cfg)
    assert PAD_US >= 100
    assert padded.median_us < 40, padded
    assert flush_only.median_us > padded.median_us + 20, (flush_only, padded)
