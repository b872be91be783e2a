"""Benchmarking: the one place forge times kernels (runs inside the worker).

Method:
- warm-up by time (at least `warmup_s`, and three calls) for the candidate and the baseline;
- before every timed call, the last-level cache is flushed by a buffer larger than it (CUDA: 2 x L2, at
  least 256 MiB, read, so that the L2 is left holding clean lines; CPU: 256 MiB written);
- CUDA: the flush and `PAD_US` of GPU time more (a spin, `torch.cuda._sleep`), then a pair of events around
  the call, all queued without waiting, and `torch.cuda.synchronize()` (device-wide) before reading them. The
  flush and the spin keep the GPU busy while the CPU queues the call, so the time is the GPU's, not the launch
  path's (as in Triton's do_bench). Launch paths measured on an H100 (benchmarks/launch_path.py, h200.md
  2026-12-07): 27-36 us for a Helion kernel, 45-67 us for eager's six launches of an RMSNorm; the flush takes
  100 us there, but reads its 256 MiB faster on an H200 (about 60 us at its copy rate), and unpadded timings
  showed p90s of 12-28 us over 8-22 us medians under load where padded ones did not;
- CPU: `time.perf_counter_ns` around the call;
- candidate and baseline are interleaved call by call in the same process on the same inputs, until
  both have `min_runs` samples and `budget_s` has passed (or `max_runs`);
- statistics: median, p10, p90, mean and standard deviation, the count, and the median's 95% interval
  (order statistics, forge.confidence).
The same conditions for both (issue 13 item 8, a fair clock): every timed call of either side allocates
its outputs inside the timed region. Eager's ATen op does (an `empty_like` in the op); the candidate is
timed as the dispatcher runs it in the model (forge.runtime.dispatch.GuardedKernel allocates each call's
outputs with `empty_like`/`empty_strided`), so the harness wraps it in a call that allocates its outputs with
`torch.empty_strided` from the same allocator first (forge.evaluate.spotcheck.SpotCheck.wrap, in the worker).
Timing `out=` into one buffer reused was not fair: on the CPU a large output's first touch (fresh pages every
call, as eager pays) is a good part of a memory-bound op: a kernel doing eager's work measured 2.3-2.9x
"faster" than eager on a 32x393216 softmax that way, 1.02x with both allocating (the issue); eager's own op
through `out=` into a reused buffer, 3.3-3.9x on softmax and log_softmax, 0.86-1.00x allocating each call
(benchmarks/fair_clock.py on a loaded 2-core CPU: benchmarks/results/cpu-fair-clock.json).
Allocating both outside the timed region is no option: eager's allocation cannot be taken out of its call.
The roofline floor's check and the search's "reached the roofline floor" stop read these times. A task's
eager time is the median of the eager medians timed alongside its candidates
(forge.search.driver.TaskSearch.eager_us), never the smallest: one disturbed baseline must not move it.
The roofline floor of a task is its minimum bytes over the device's measured copy bandwidth
(`measure_bandwidth`); a candidate faster than that cannot be doing the work.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from forge.confidence import median_ci
from forge.kernel import Timing


@dataclass(frozen=True)
class BenchConfig:
    """How long and how often to time."""

    warmup_s: float = 0.05
    budget_s: float = 0.5
    min_runs: int = 10
    max_runs: int = 200


DEFAULT_BENCH = BenchConfig()

def stats(samples_us: list[float]) -> Timing:
    """Summary statistics of samples in microseconds."""
    s = sorted(samples_us)
    n = len(s)
    lo, hi = median_ci(s)
    return Timing(median_us=statistics.median(s), p10_us=s[int(0.1 * (n - 1))], p90_us=s[int(0.9 * (n - 1))],
                  mean_us=statistics.fmean(s), std_us=statistics.pstdev(s) if n > 1 else 0.0, n=n, ci_lo_us=lo,
                  ci_hi_us=hi)


PAD_US = 100.0  # GPU time queued after each flush (CUDA), ahead of the timed call: see the module's docstring


class Clock:
    """Times one call on a device, flushing the cache before it (CUDA: and `pad_us` of GPU time after that)."""

    def __init__(self, device: str, pad_us: float = PAD_US) -> None:
        self.cuda = device.startswith("cuda")
        self.pad_cycles = _cycles(device, pad_us) if self.cuda and pad_us > 0 else 0
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
            size = max(256 << 20, 2 * l2)
        else:
            size = 256 << 20
        self.flush_buf = torch.empty(size // 4, dtype=torch.int32, device=device)
        self.flush_sink = torch.empty((), dtype=torch.int32, device=device)
        if self.cuda:
            self.flush_buf.fill_(1)  # read at every flush, written once

    def flush(self) -> None:
        """Evict the cache. CUDA: read the buffer (an int32 max, at the copy rate), which leaves the L2 holding
        clean lines of it. A flush that writes leaves dirty lines whose write-back the next kernel pays for
        (measured on the H200: +1 us on a 16 MB copy, +2.6 us on 64 MB); one that reads times the copies as
        one that writes and then reads does (7.1 against 7.2 us at 16 MB, 10.9/10.8 at 32, 17.9/17.9 at
        64, 33.7/32.4 at 128, 125.4/125.5 at 512; benchmarks/flush_check.py, h200.md), at half the cost.
        Every timed call pays it: a read as a sum into int64 ran at a fifth of the copy rate (475 us on an
        H100 for 256 MiB) and was most of a candidate's timing (benchmarks/clock_cost.py). CPU: write it."""
        if self.cuda:
            torch.amax(self.flush_buf, dim=0, out=self.flush_sink)
            if self.pad_cycles:
                with torch.cuda.device(self.flush_buf.device):  # the flush's GPU, whichever is current
                    torch.cuda._sleep(self.pad_cycles)
        else:
            self.flush_buf.fill_(1)

    def time_us(self, fn: Callable[[], object]) -> float:
        """Time one call of fn in microseconds, after a cache flush."""
        return time_call_us(fn, self.cuda, self.flush)


def _cycles(device: str, us: float) -> int:
    """The GPU clock cycles `torch.cuda._sleep` spins for `us` microseconds on this device, timed here (the clock
    rate differs between GPUs and boost states): after about 10 ms of spinning (an idle GPU's clocks rise), each
    probe queued behind a spin, so that its events time the GPU and not the launch; the fastest of three."""
    probe = 200_000

    def spin() -> None:
        torch.cuda._sleep(probe)

    with torch.cuda.device(device):
        for _ in range(10):
            spin()
        per_us = max(probe / max(time_call_us(spin, True, before=spin), 1e-3) for _ in range(3))
    return int(us * per_us)


def time_call_us(fn: Callable[[], object], cuda: bool, before: Callable[[], object] | None = None) -> float:
    """One call of fn in microseconds: the one clock every measurement of forge's reads (kernels against
    eager, whole forwards, graphs). CUDA: events around the call after a device-wide synchronisation, and
    `before` (a cache flush) queued first, so that while the GPU runs it the CPU queues fn and the launch
    cost is hidden; CPU: perf_counter_ns around the call, after `before`."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3
    if before is not None:
        before()
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def interleaved(clock: Clock, fns: list[Callable[[], object]], cfg: BenchConfig,
                prepare: Callable[[bool], None] | None = None) -> list[Timing]:
    """Time several callables call by call in turn; one Timing each. `prepare(timed)`: called before every
    round, warm-up (False) and timed (True), outside the timed region (forge.evaluate.spotcheck perturbs the inputs
    and draws the calls it keeps there)."""
    prep = prepare or (lambda timed: None)

    def warm() -> None:
        prep(False)
        for fn in fns:
            fn()

    deadline = time.perf_counter() + cfg.warmup_s
    for _ in range(3):
        warm()
    while time.perf_counter() < deadline:
        warm()
    if clock.cuda:
        torch.cuda.synchronize()
    samples: list[list[float]] = [[] for _ in fns]
    deadline = time.perf_counter() + cfg.budget_s
    while len(samples[0]) < cfg.max_runs and (len(samples[0]) < cfg.min_runs or time.perf_counter() < deadline):
        prep(True)
        for s, fn in zip(samples, fns, strict=True):
            s.append(clock.time_us(fn))
    return [stats(s) for s in samples]


def measure_bandwidth(device: str, nbytes: int = 512 << 20) -> float:
    """Device copy rate in bytes per second (read + write): the best of several copies, since the floor
    must use the rate the device can reach (load from other processes only ever lowers it)."""
    src = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    clock = Clock(device)
    if device.startswith("cuda"):  # a GPU idle until now runs its first copies at lower clocks: ~10 ms of them first
        for _ in range(30):
            dst.copy_(src)
    times = [clock.time_us(lambda: dst.copy_(src)) for _ in range(7)]
    return 2 * nbytes / (min(times) * 1e-6)
