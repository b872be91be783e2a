"""Evaluation on a Ray cluster: builds as Ray tasks, judging on Ray actors, one per GPU (CPU: one per slot).

Each actor is a judge as on one host: it holds a forge.evaluate.parent.Worker, whose sandboxed worker process
is the only one that loads candidate code (the actor never does); it is handed the build as bytes (`Shipped`),
writes them into its own folder, checked against their SHA-256, and returns the same frozen EvalResult a
local Evaluator does. The driver keeps the store and the search. An actor lost mid-evaluation (killed, its
node gone) is started again by Ray (elsewhere when its node is gone), and its in-flight candidate is judged
again on the next free actor (forge.evaluate.pool.Lost): only in-flight work is lost, never a stored result.

Results are compared within one device model: the actors of other models than the one chosen (the driver's
own device's, else the one most actors have) are let go, and the run's kernels are recorded as tuned on it
(forge.runtime.artifact checks that model when they are loaded).
Important: Ray is an optional extra (`pip install forge-kernels[ray]`); this module imports it only when used.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import hashlib
import itertools
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from forge.bench import DEFAULT_BENCH, BenchConfig
from forge.errors import UserError
from forge.evaluate.build import BuildResult, build, file_sha256
from forge.evaluate.devices import device_arch, device_model
from forge.evaluate.evaluator import BaseEvaluator, Evaluator, default_memory, judge_built
from forge.evaluate.parent import Worker
from forge.evaluate.pool import Lost, Scale, Slots
from forge.kernel import Candidate, EvalResult, Status, TaskSpec

log = logging.getLogger(__name__)
START_S = 300.0  # for the actors to start (a cluster that has not the resources never does)
CLOSE_S = 10.0  # for the actors to stop their workers and remove their folders before they are killed


def evaluator_for(device: str, scale: Scale, **kw: Any) -> BaseEvaluator:
    """The evaluator `scale` asks for: a RayEvaluator on its cluster, else an Evaluator with its workers."""
    if scale.ray:
        return RayEvaluator(scale.ray, device, workers=scale.workers if scale.workers > 1 else None, **kw)
    return Evaluator(device, workers=scale.workers, **kw)


@dataclass(frozen=True)
class Shipped:
    """A build as it travels from the node that built it to the actor that judges it: its result and bytes."""

    result: BuildResult
    data: bytes = b""


def ship_build(cand: Candidate, arch: str | None, cache_dir: str | None) -> Shipped:
    """A Ray task: build `cand` on this node (its cache) and return the file's bytes with the result."""
    res = build(cand, arch, Path(cache_dir) if cache_dir else None)
    return Shipped(res, Path(res.path).read_bytes() if res.ok else b"")


def unpack(shipped: Shipped, folder: Path) -> BuildResult:
    """The shipped file under `folder` (by its build key; written only when it is not there with those bytes'
    SHA-256), as a BuildResult naming that local path."""
    res = shipped.result
    if not res.ok:
        return res
    target = folder / res.key / Path(res.path).name
    if not target.exists() or file_sha256(target) != _sha(shipped.data):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_bytes(shipped.data)
        os.replace(tmp, target)
    return replace(res, path=str(target))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class JudgeActor:
    """A Ray actor: one judge with its sandboxed worker, on one GPU (Ray sets CUDA_VISIBLE_DEVICES) or CPU slot."""

    def __init__(self, device: str, timeout_s: float) -> None:
        import ray

        self.device, self.timeout_s = device, timeout_s
        self.node = ray.util.get_node_ip_address()
        self.worker = Worker(device, default_memory(device))
        self.dir = Path(tempfile.mkdtemp(prefix="forge-ray-judge-"))

    def close(self) -> None:
        """Its worker stopped and the builds unpacked for it removed (before the actor is killed: a killed
        process cleans nothing)."""
        try:
            self.worker.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def folders(self) -> tuple[str, str]:
        """Its folders on its node: the unpacked builds' and its worker's."""
        return str(self.dir), str(self.worker.lib.parent)

    def info(self) -> tuple[str, str, str, int]:
        """(device model, node id, node address, process id)."""
        import ray

        return device_model(self.device), ray.get_runtime_context().get_node_id(), self.node, os.getpid()

    def judge(self, task: TaskSpec, cand: Candidate, shipped: Shipped, seed: int, bench: BenchConfig | None,
              retime: bool) -> EvalResult:
        """One shipped build judged in this actor's worker; the result names the node."""
        res = judge_built(self.worker, task, cand, unpack(shipped, self.dir), seed, bench, self.timeout_s, retime)
        return replace(res, device=f"{res.device}@{self.node}")


def _lost_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rx

    return (rx.RayActorError, rx.ObjectLostError, rx.OwnerDiedError, rx.NodeDiedError, rx.WorkerCrashedError)


@functools.cache
def _remote() -> tuple[Any, Any]:
    """Ray's handles of the build task and the actor class, made once."""
    import ray

    return ray.remote(max_retries=3)(ship_build), ray.remote(JudgeActor)


class RayEvaluator(BaseEvaluator):
    """Judges candidates on a Ray cluster's actors (one per GPU; CPU: `workers`), built by Ray tasks."""

    def __init__(self, address: str | None, device: str = "cpu", *, workers: int | None = None,
                 timeout_s: float = 120.0, bench: BenchConfig | None = DEFAULT_BENCH, seed: int | None = None,
                 cache_dir: Path | None = None) -> None:
        """`address`: the cluster's ("auto": the one this host is part of; "local": a new one of this host's;
        None: the one this process is connected to, else a new local one). `workers`: actors on the CPU
        (default: half the cluster's CPUs); on CUDA one per GPU of the cluster."""
        try:
            import ray
        except ImportError:
            raise UserError("--ray needs Ray: pip install 'forge-kernels[ray]'") from None
        self._own = not ray.is_initialized()
        if self._own:  # "local": a cluster of this host's own, started here
            _reachable(address)  # Ray itself retries an address nobody listens on for minutes
            try:
                ray.init(address=None if address == "local" else address, include_dashboard=False,
                         logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UserError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}") from None
        self.seed, self.bench, self.timeout_s, self.cache_dir = seed, bench, timeout_s, cache_dir
        self.actors: list[Any] = []
        try:
            self._start(address, device, workers, timeout_s)
        except BaseException:  # a bad option, actors that did not start, Ctrl-C: no actor (nor cluster) is left
            self.close()
            raise

    def _start(self, address: str | None, device: str, workers: int | None, timeout_s: float) -> None:
        """Start the actors and keep those of one device model (see the module docstring)."""
        import ray

        cuda = device.startswith("cuda")
        self.device = "cuda:0" if cuda else "cpu"  # in each actor: Ray pins it to its own GPU
        resources = ray.cluster_resources()
        n = int(resources.get("GPU", 0)) if cuda else (workers or max(1, int(resources.get("CPU", 1)) // 2))
        if n < 1:
            raise UserError(f"the Ray cluster at {address or 'this process'} has no GPU")
        if not cuda and n >= resources.get("CPU", 1):  # a CPU actor holds one: the builds need some left
            raise UserError(f"Invalid --workers: {n} (the Ray cluster has {resources.get('CPU', 1):.0f} CPUs; "
                            "leave at least one for the builds)")
        _, actor = _remote()
        opts = {"num_gpus": 1, "num_cpus": 0} if cuda else {"num_cpus": 1}
        actors = self.actors = [actor.options(max_restarts=-1, **opts).remote(self.device, timeout_s)
                                for _ in range(n)]
        try:
            infos = ray.get([a.info.remote() for a in actors], timeout=START_S)
        except ray.exceptions.GetTimeoutError:
            raise UserError(f"{n} Ray actors did not start in {START_S:.0f} s (the cluster lacks the "
                            "resources?)") from None
        except ray.exceptions.RayError as e:  # an actor that died starting (its worker, its node)
            raise UserError(f"the Ray actors did not start: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        here = device_model(device) if not cuda or _has_cuda() else None
        self.device_model = _one_model(infos, here)
        for a, info in zip(actors, infos, strict=True):
            if info[0] != self.device_model:
                log.warning("the %s on %s is left out: this run is tuned on %s", info[0], info[2], self.device_model)
                ray.kill(a, no_restart=True)
        self.actors = [a for a, i in zip(actors, infos, strict=True) if i[0] == self.device_model]
        self.infos = [i for i in infos if i[0] == self.device_model]
        self.arch = device_arch(device) if here == self.device_model and cuda else _arch_of(self.device_model)
        self._nodes = itertools.cycle(sorted({i[1] for i in self.infos}))  # builds go round the judges' nodes
        self.slots: Slots[int] = Slots(range(len(self.actors)))
        log.info("judging on %d Ray actors (%s)", len(self.actors), self.device_model)

    @property
    def parallel(self) -> int:
        """One candidate at a time per actor."""
        return len(self.actors)

    def pids(self) -> list[int]:
        """The actors' process ids, as they are now (an actor started again has a new one)."""
        import ray

        return [i[3] for i in ray.get([a.info.remote() for a in self.actors], timeout=START_S)]

    def submit(self, task: TaskSpec, cand: Candidate, seed: int, bench: BenchConfig | None,
               retime: bool = False) -> cf.Future[EvalResult]:
        """Build `cand` as a Ray task on one of the judges' nodes; judge it on the next free actor."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ship, _ = _remote()
        where = NodeAffinitySchedulingStrategy(next(self._nodes), soft=True)  # soft: another node if it is gone
        built = ship.options(num_cpus=1, scheduling_strategy=where).remote(
            cand, self.arch, str(self.cache_dir) if self.cache_dir else None)

        def job(i: int) -> EvalResult:
            try:
                return ray.get(self.actors[i].judge.remote(task, cand, built, seed, bench, retime),
                               timeout=2 * self.timeout_s + 60)
            except ray.exceptions.GetTimeoutError:
                ray.kill(self.actors[i], no_restart=False)  # hung: Ray starts it again
                why = "did not answer"
            except _lost_errors() as e:  # the actor died or its node went away
                why = f"was lost ({type(e).__name__})"
            except ray.exceptions.RayError as e:  # a build task that failed: this candidate's failure
                return EvalResult(Status.CRASH, f"Ray: {type(e).__name__}: {str(e)[:500]}", device=self.device)
            self._heal(i)
            raise Lost(f"the Ray actor {i} {why}; its candidate is judged again",
                       EvalResult(Status.CRASH, "every Ray actor that judged it was lost", device=self.device))

        # the actor is taken once the build is done: its time limit is the judging's, not the build's
        return self.slots.submit(job, ready=lambda: ray.wait([built], num_returns=1))

    def _heal(self, i: int) -> None:
        """Wait (START_S at most) for Ray to have started actor `i` again, so that the next job finds it up
        (while it restarts, a call fails at once with ActorUnavailableError)."""
        import ray

        deadline = time.monotonic() + START_S
        while True:
            try:
                ray.get(self.actors[i].info.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except ray.exceptions.RayError as e:
                if time.monotonic() > deadline:
                    log.warning("the Ray actor %d is not back (%s)", i, type(e).__name__)
                    return
                time.sleep(0.5)

    def close(self) -> None:
        """Let the actors go (and the local cluster, when this evaluator started it)."""
        import ray

        try:
            if getattr(self, "slots", None) is not None:  # None: closed before the actors started
                self.slots.close()
        finally:
            try:  # each actor cleans its folders, then goes; one that does not answer in time goes as it is
                closing = [a.close.remote() for a in self.actors]
                _, late = ray.wait(closing, num_returns=len(closing), timeout=CLOSE_S)
                if late:
                    log.warning("%d Ray actors did not close in %.0f s: their folders may stay", len(late), CLOSE_S)
            except Exception as e:  # noqa: BLE001 - a lost actor or cluster: killed below all the same
                log.warning("the Ray actors did not all close (%s): their folders may stay", type(e).__name__)
            for a in self.actors:
                _kill(a)
            self.actors = []
            if self._own:
                ray.shutdown()


def _kill(actor: Any) -> None:
    """Let one actor go for good (one already gone, or a cluster already down, is no error)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception as e:  # noqa: BLE001 - closing goes on with the next actor
        log.warning("a Ray actor could not be killed: %s", e)


def _reachable(address: str | None) -> None:
    """UserError unless something listens at a HOST:PORT address (ray://HOST:PORT too); "auto", "local" and
    None are Ray's to resolve (it fails at once when there is nothing)."""
    if address in (None, "auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"Invalid --ray: {address!r} (auto, local, HOST:PORT or ray://HOST:PORT)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10.0).close()
    except OSError as e:
        raise UserError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def _one_model(infos: list[tuple[str, str, str, int]], here: str | None) -> str:
    """The device model to judge on: this host's when actors have it, else the one most actors have."""
    counts = collections.Counter(i[0] for i in infos)
    return here if here in counts else counts.most_common(1)[0][0]


def _arch_of(model: str) -> str | None:
    """The architecture at the end of a GPU's device model ("NVIDIA H200 sm_90" -> "sm_90"); None on the CPU."""
    last = model.rsplit(" ", 1)[-1]
    return last if last.startswith("sm_") else None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
