"""What the judge measures itself, in forge's process: eager's time and a round's own cost per task, the
device's clock and copy rate. Measured once per device and task (not for every candidate), by a clock and
a copy the candidate cannot reach: what forge.evaluate.judge holds the worker's claims against."""

from __future__ import annotations

import functools
import logging
import random
import statistics
import threading
import time
from dataclasses import dataclass, replace

import torch
from torch.utils.flop_counter import FlopCounterMode

from forge.bench import BenchConfig, Clock, interleaved, measure_bandwidth, time_call_us
from forge.capture.export import empty_output
from forge.evaluate.spotcheck import SpotCheck
from forge.evaluate.verify import Reference, generator, make_input
from forge.kernel import TaskSpec, Timing
from forge.tasks.cut import compile_source

_SYSTEM = random.SystemRandom()
log = logging.getLogger(__name__)
RENEW_INTENSITY = 8.0  # floating-point operations per byte moved from which every round draws all inputs anew


@dataclass
class _Here:
    """What the judge measured itself, per device and per task: not redone for every candidate."""

    clocks: dict[str, Clock]
    bandwidth: dict[str, float]
    tasks: dict[tuple[str, str], tuple[Timing, float]]  # (device, task) -> (eager's timing, round overhead us)
    hidden: dict[str, float]  # device -> the GPU time queued ahead of each timed call (flush and pad), us


_HERE = _Here({}, {}, {}, {})
_LOCK = threading.Lock()  # the copy rate may be measured ahead in another thread (measure_ahead)


def measured_here(ref: Reference, task: TaskSpec, device: str, bench: BenchConfig, again: bool = False
                  ) -> tuple[Timing, float]:
    """Eager's median by this process's clock, and the cost of a round's perturbing and fresh outputs (per
    task and device, measured once, or `again`): what the cross-check holds the worker's times against."""
    key = (device, task.source + repr(task.inputs))
    if again or key not in _HERE.tasks:
        gen = generator(device, _SYSTEM.getrandbits(40))
        inputs = [make_input(m, 0, gen, device, j in ref.signed, ref.domains.get(j, ""))
                  for j, m in enumerate(task.inputs)]
        spot = SpotCheck(inputs, task.outputs, bench.min_runs, device, ref.domains, renews(task))
        with torch.no_grad():
            (eager,) = interleaved(clock(device), [lambda: ref.eager(*inputs)],
                                   replace(bench, budget_s=min(bench.budget_s, 0.2)), spot.prepare)
            rounds = 20
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(rounds):
                spot.prepare(False)
                [empty_output(m, device) for m in task.outputs]
            _sync(device)
        _HERE.tasks[key] = (eager, (time.perf_counter() - t0) / rounds * 1e6)
    return _HERE.tasks[key]


@functools.lru_cache(maxsize=256)
def renews(task: TaskSpec) -> bool:
    """Whether the spot check draws all of the task's inputs anew every round (forge.evaluate.spotcheck's
    module doc): its reference's
    floating-point operations (counted by torch's FlopCounterMode on meta tensors: matrix products,
    convolutions, attention) at least RENEW_INTENSITY a byte of its roofline floor. The judge's to decide, in
    forge's process (the Time step says): in a confined worker the counter's first use imports torch._dynamo,
    which makes a folder, and seccomp kills the worker for it; so it is here, not in forge.evaluate.spotcheck,
    which the worker imports."""
    try:
        inputs = [torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype, device="meta") for m in task.inputs]
        with FlopCounterMode(display=False) as counter:
            compile_source(task.source)(*inputs)
        flops = counter.get_total_flops()
    except Exception as e:  # an op without a meta kernel: counted as none
        log.info("%s: operations not counted, inputs perturbed, not drawn anew (%s)", task.key, e)
        return False
    return flops >= RENEW_INTENSITY * max(task.floor_bytes, 1)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def clock(device: str) -> Clock:
    """The device's clock in this process (made once)."""
    if device not in _HERE.clocks:
        _HERE.clocks[device] = Clock(device)
    return _HERE.clocks[device]


def hidden_us(device: str) -> float:
    """How much of a call's launch path the clock can leave out: the GPU time it queues ahead of the call (the
    flush and the pad, forge.bench.Clock.flush), timed here once a device (the median of 5); 0 on the CPU."""
    if not device.startswith("cuda"):
        return 0.0
    if device not in _HERE.hidden:
        c = clock(device)
        with torch.cuda.device(device):
            _HERE.hidden[device] = statistics.median(time_call_us(c.flush, True) for _ in range(5))
    return _HERE.hidden[device]


def bandwidth(device: str) -> float:
    """The device's copy rate, measured by this process once (a worker could report any); a call while
    `measure_ahead` measures it waits for that measurement."""
    if device in _HERE.bandwidth:  # measured: no wait on another device's measurement
        return _HERE.bandwidth[device]
    with _LOCK:
        if device not in _HERE.bandwidth:
            _HERE.bandwidth[device] = _measure(device)
        return _HERE.bandwidth[device]


def _measure(device: str) -> float:
    if device.startswith("cuda"):  # its events and synchronisations on that GPU, in any thread
        with torch.cuda.device(device):
            return measure_bandwidth(device)
    return measure_bandwidth(device)


def remeasured(device: str) -> float:
    """The copy rate measured again now, and kept if higher: the floor uses the fastest copy seen, so one
    measured while the device was slowed (clocks, another process) is not what a fast candidate is held to."""
    with _LOCK:
        _HERE.bandwidth[device] = max(_measure(device), _HERE.bandwidth.get(device, 0.0))
        return _HERE.bandwidth[device]


def measure_ahead(devices: list[str]) -> threading.Thread:
    """Measure the devices' copy rates in a thread of their own now (while the workers start and the first
    candidates build: on this 2-core CPU 0.85 s of 7 copies of 512 MiB, on a GPU the parent's CUDA start):
    the judge then finds them measured. The judge asks for the rate before a candidate's timing, so the
    measurement never runs beside one. The thread is returned to be joined: a process that exits while it
    copies can die in PyTorch's teardown ("terminate called without an active exception")."""
    def run() -> None:
        for d in dict.fromkeys(devices):
            try:
                bandwidth(d)
            except Exception as e:  # noqa: BLE001 - the judge measures it again when it asks, and says why
                log.warning("the %s copy rate was not measured ahead: %s", d, e)

    thread = threading.Thread(target=run, name="forge-bandwidth", daemon=True)
    thread.start()
    return thread
