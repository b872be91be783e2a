"""Parent side of the worker processes: start, send a step, time out, restart after a crash.

One long-lived worker per device (per GPU, pinned with CUDA_VISIBLE_DEVICES). A request that does not
answer within its time limit gets TIMEOUT and the worker is killed and restarted; a worker that dies
(end of file on the pipe) gives CRASH with its signal and the tail of its log. Either way the next
request finds a fresh worker, so nothing a candidate does takes the harness down. A request is judged
in this process (forge.evaluate.judge) through the worker's steps and the arena they share (forge.evaluate.arena).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

from forge.backends import BACKENDS
from forge.capture.scans import libraries
from forge.evaluate import devmem
from forge.evaluate.arena import Arena
from forge.evaluate.judge import evaluate
from forge.evaluate.landlock import Writable, for_worker
from forge.evaluate.privilege import Drop, drop_for, kill_all, release_id
from forge.evaluate.sandbox import limits, network_namespace, nondumpable, process_uid, scrubbed_env, worker_env
from forge.evaluate.steps import ARENA_STEPS, EvalRequest, Load, Reply, decode, valid_reply
from forge.evaluate.wire import Late, recv_within, signal_name
from forge.kernel import EvalResult, Status

log = logging.getLogger(__name__)
_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout (forge/evaluate/parent.py)


LOADS_PER_WORKER = 256  # loads stay in a worker (a dlopen'ed copy, a CUDA module): a fresh one after so many


class Worker:
    """One worker process for one device; restarted whenever it crashes or hangs."""

    def __init__(self, device: str = "cpu", memory_bytes: int | None = None, start_timeout_s: float = 120.0,
                 confined: bool | None = None, program: tuple[str, ...] = ("-m", "forge.evaluate.child"),
                 own_network: bool | None = None, triton_cache: str | None = None,
                 unprivileged: bool | None = None) -> None:
        """`confined`: the worker installs forge.evaluate.confine's seccomp filter. `own_network`: a network
        namespace of its own when forge runs as root (forge.evaluate.sandbox.limits). `unprivileged`: when
        forge runs as root, the worker gives up root for a user of its own (forge.evaluate.privilege). Each
        defaults to on for a CPU worker; a CUDA worker gets the namespace and the filter too unless
        FORGE_CUDA_SANDBOX=0 or FORGE_CUDA_SECCOMP=0 (with both the CUDA corpus passed, 33 tests, and the recipe
        kernels' throughput was 221.5 a minute against 224-235 without, on an H100 on 2026-12-06). A confined
        CUDA worker judges no Python (Triton, Helion) candidate itself, whose compiler is a program it would
        start: `request` hands those to an unconfined worker of its own (`python_worker`, its own process,
        started at the first one). A CUDA worker gives up root as a CPU one does (unless FORGE_CUDA_SANDBOX=0):
        its arena comes as a file descriptor over a socket of its own (forge.evaluate.devmem; legacy CUDA IPC
        fails between two users).
        `program`: what Python runs (tests run a worker a candidate has taken over). `triton_cache`: a
        subfolder of Triton's cache that is this worker's own (one per GPU of a pool)."""
        cuda = device.startswith("cuda")
        sandbox = not cuda or os.environ.get("FORGE_CUDA_SANDBOX", "1") != "0"
        self.triton_cache = triton_cache
        self.program = program
        self.isolate_network = sandbox if own_network is None else own_network
        self.device = device
        self.confined = (not cuda or os.environ.get("FORGE_CUDA_SECCOMP", "1") != "0") if confined is None else confined
        self._python: Worker | None = None  # a confined CUDA worker's unconfined one, for Python candidates
        self.unconfined = ""  # why the worker could not confine itself, when it could not
        self.own_network = False  # the worker runs in a network namespace of its own (forge.evaluate.sandbox.limits)
        nondumpable()  # a worker that is not root cannot read forge's environment or memory through /proc
        self.memory_bytes = memory_bytes
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.preload: tuple[str, ...] = ()  # libraries the worker imports before it confines itself
        self.restarts = 0
        self._staged = 0  # libraries staged for a Load so far
        self._first_load = 0  # the staged count when the running worker started
        self.last_exit: int | None = None  # the exit code (-signal) of the last worker that died in a step
        self._dir = tempfile.TemporaryDirectory(prefix="forge-worker-")
        self.arena = Arena(device)
        self._memfd = self.arena.memfds
        self.uid: int | None = None  # the user the running worker is (read from /proc)
        self._own_id: int | None = None  # a user id of its own it holds (privilege.fresh_id)
        self.drop, self.privileged = self._plan(sandbox if unprivileged is None else unprivileged)
        self.allowed: Writable | None = None  # what Landlock lets the running worker write (None: no Landlock)
        # Landlock (forge.evaluate.landlock) on CUDA workers too unless FORGE_CUDA_LANDLOCK=0 (on an H100 with
        # /dev/shm and /proc/self allowed: the sandbox, own-user and Triton tests 9 passed)
        self._landlock = not cuda or os.environ.get("FORGE_CUDA_LANDLOCK", "1") != "0"
        self._shares: socket.socket | None = None  # CUDA: where the arena's descriptors go to the running worker
        self._shared = 0  # the arena generation the running worker has been sent
        self._life = threading.Lock()  # `start` (from a judging slot's thread) against `close` (from any)
        self._closed = False

    def _plan(self, want: bool) -> tuple[Drop | None, str]:
        """The worker's folders (its own scratch, where it may write; `lib`, where built libraries are copied
        for it to load) and the Drop that gives up root; with the reason why the worker runs as root when it
        does ("" otherwise)."""
        root = Path(self._dir.name)
        self.scratch, self.lib = root / "scratch", root / "lib"
        self.scratch.mkdir()
        self.lib.mkdir()
        os.chmod(self.lib, 0o755)
        found, self._own_id = drop_for(want, root, self.scratch, [_ROOT, str(self.scratch), str(self.lib)])
        return (None, found) if isinstance(found, str) else (found, "")

    @property
    def log_path(self) -> Path:
        """The worker's stdout/stderr."""
        return Path(self._dir.name) / "worker.log"

    def env(self) -> dict[str, str]:
        """What the worker's environment holds besides the allowlist (forge.evaluate.sandbox.worker_env)."""
        own_cache = str(self.scratch / "triton") if self.drop is not None else None  # not root's cache to write
        env = worker_env(self.device, self.confined, _ROOT, self.scratch, own_cache, self.triton_cache)
        if self.drop is not None:  # the user it is, by name: getpass.getuser() (Inductor's, on Helion's import)
            env.update(USER=self.drop.user, LOGNAME=self.drop.user)  # else asks pwd, which has no such account
        return env

    def _start(self) -> None:
        self._first_load = self._staged
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        extra = self.env()
        dev = "cuda:0" if self.device.startswith("cuda") else self.device  # the one GPU it sees
        self.logf = open(self.log_path, "ab")  # noqa: SIM115 - closed in _stop
        self.allowed = for_worker(self.scratch, extra.get("TRITON_CACHE_DIR", "")) if self._landlock else None
        theirs = self._socket()
        flags = [*(["confine"] if self.confined else []), *(["private"] if self.drop else []),
                 *([f"preload={','.join(self.preload)}"] if self.preload else []),
                 *([f"shares={theirs.fileno()}"] if theirs else [])]
        passed = (req_r, res_w, *([theirs.fileno()] if theirs else []))
        try:
            self.proc = self._popen([*self.program, str(req_r), str(res_w), dev, *flags], passed, extra)
        except subprocess.SubprocessError as e:  # the drop failed in the preexec: as forge's user, said so
            log.warning("the %s worker could not give up root (%s): it runs as root", self.device, e)
            self.drop, self.privileged = None, f"giving up root failed at start: {e}"
            flags.remove("private")
            self.proc = self._popen([*self.program, str(req_r), str(res_w), dev, *flags], passed, extra)
        finally:
            if theirs is not None:
                theirs.close()
        os.close(req_r)
        os.close(res_w)
        self._memfd = self.arena.memfds  # which memfd this worker inherited
        self.conn_out = Connection(req_w, readable=False)
        self.conn_in = Connection(res_r, writable=False)
        if not self.conn_in.poll(self.start_timeout_s):
            self._stop()
            raise RuntimeError(f"the {self.device} worker did not start: {self.log_tail()}")
        ns = network_namespace(self.proc.pid)
        self.own_network = bool(ns) and ns != network_namespace()
        self.uid = process_uid(self.proc.pid)
        try:
            hello = decode(recv_within(self.conn_in, time.monotonic() + self.start_timeout_s))
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "ready" and isinstance(hello[1], str)):
                raise EOFError(f"the worker's first message is not its ready message: {hello!r:.200}")
            self.unconfined = hello[1]
            if self.unconfined:
                log.warning("the %s worker runs without its seccomp filter: %s", self.device, self.unconfined)
        except (Late, ValueError, pickle.UnpicklingError) as e:  # a start that stalls or speaks nonsense
            self._stop()
            raise RuntimeError(f"the {self.device} worker did not start properly ({e}): {self.log_tail()}") from e
        except EOFError as e:
            code = self.proc.wait() if self.proc else None
            self._stop()
            raise RuntimeError(f"the {self.device} worker died at start ({signal_name(code)}): "
                               f"{self.log_tail()}") from e

    def _socket(self) -> socket.socket | None:
        """A CUDA worker's socket pair for its arena's descriptors (forge.evaluate.devmem): this end kept, the
        worker's returned (None on the CPU, whose arena's memfd the worker inherits)."""
        if self._shares is not None:
            self._shares.close()
        self._shares, self._shared = None, 0
        if not self.device.startswith("cuda"):
            return None
        self._shares, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._shares.shutdown(socket.SHUT_RD)  # one way: nothing (no descriptor) comes back from the worker
        self._shares.settimeout(5.0)  # a worker that never reads fills its queue: it is restarted, not waited on
        return theirs

    def _share(self, msg: object) -> None:
        """Send the running CUDA worker the arena's descriptor of a step's generation it has not had."""
        ref = msg.arena if isinstance(msg, ARENA_STEPS) else None
        if ref is not None and ref.cuda and ref.generation != self._shared and self._shares is not None \
                and ref.generation == self.arena.generation and self.arena.cuda_fd >= 0:
            try:
                devmem.send(self._shares, ref.generation, self.arena.cuda_fd)
            except OSError:  # a worker that leaves its socket full is one that broke the protocol: it dies
                if self.proc is not None and self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                raise
            self._shared = ref.generation

    def _popen(self, args: list[str], passed: tuple[int, ...], extra: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, *args], pass_fds=passed + ((self.arena.fd,) if self.arena.fd >= 0 else ()),
            env=scrubbed_env(extra), cwd=self.scratch, stdin=subprocess.DEVNULL, stdout=self.logf,
            stderr=subprocess.STDOUT,
            preexec_fn=limits(self.memory_bytes, None, self.isolate_network, self.drop, self.allowed))

    def stage(self, path: str) -> str:
        """A copy of a built library (or module) in the worker's `lib` folder, named by its SHA-256, that the
        worker can read and not write; the worker loads that, never the build cache (forge's to write). The
        path as it was when it cannot be read (the worker's load then fails with the reason)."""
        try:
            data = Path(path).read_bytes()
        except OSError:
            return path
        # Named by its hash and the load's number: the same binary loaded again (two candidates that differ in a
        # comment) is a fresh instance, statics and all, not the handle glibc keeps for a name already loaded.
        self._staged += 1
        staged = self.lib / f"{hashlib.sha256(data).hexdigest()[:32]}-{self._staged}{Path(path).suffix}"
        tmp = staged.with_name(f".{staged.name}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, staged)
        return str(staged)

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if self.drop is not None and self._own_id is not None:  # and what it left running in a session of its own
                kill_all(self._own_id)
            for c in (self.conn_in, self.conn_out):
                c.close()
            self.logf.close()
        if self._shares is not None:
            self._shares.close()
            self._shares = None
        self.proc = None

    def log_tail(self, n: int = 800) -> str:
        """The last n characters the worker printed."""
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def refuses(self, backend: str) -> bool:
        """Whether this worker cannot load `backend`'s candidates: a Python one (Triton, Helion) on a CUDA worker
        under the seccomp filter, whose compiler (ptxas) is a program the filter kills the worker for starting."""
        return self.confined and self.device.startswith("cuda") and not BACKENDS[backend].native

    def python_worker(self) -> Worker:
        """The worker that judges this one's Python candidates when it refuses them: unconfined, otherwise the
        same (device, network namespace, Triton cache), a process of its own made at its first candidate."""
        with self._life:
            if self._closed:
                raise RuntimeError(f"the {self.device} worker is closed")
            if self._python is None:
                self._python = Worker(self.device, self.memory_bytes, self.start_timeout_s, confined=False,
                                      own_network=self.isolate_network, triton_cache=self.triton_cache)
            return self._python

    def for_backend(self, backend: str) -> Worker:
        """The worker that runs `backend`'s candidates: this one, or its `python_worker` (started now, so that
        its start is not counted in the candidate's time) for those it refuses."""
        if not self.refuses(backend):
            return self
        python = self.python_worker()
        try:
            python.start()
        except RuntimeError as e:  # its first step starts it again and fails as a result
            log.warning("the %s Python worker did not start ahead of its step: %s", self.device, e)
        return python

    def request(self, req: EvalRequest, timeout_s: float = 120.0) -> EvalResult:
        """Judge one candidate (forge.evaluate.judge); failures of the process come back as TIMEOUT or CRASH results
        (a closed worker raises). A candidate this worker refuses goes to its `python_worker`."""
        worker = self.for_backend(req.backend)
        if worker is not self:
            return worker.request(req, timeout_s)
        self.log_path.write_bytes(b"")  # the log tail of a failure should be this request's
        return evaluate(self, req, timeout_s)

    def exchange(self, msg: object, timeout_s: float) -> Reply | EvalResult:
        """Send one step and wait for its Reply; a TIMEOUT or CRASH result when the worker hangs or dies (it
        is restarted for the next step)."""
        start = time.perf_counter()
        self.last_exit = None  # of this step's worker only (a crash-retry must not read an earlier death)
        if self.proc is not None and self._memfd != self.arena.memfds:  # the arena got a new memfd (shrunk)
            self._stop()
        if isinstance(msg, Load):
            self._needs(libraries(msg.task.source))
            if self.proc is not None and self._staged - self._first_load >= LOADS_PER_WORKER:
                self._stop()  # its loaded libraries are never unloaded
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            try:
                self._start()
            except RuntimeError as e:  # the worker did not start or died starting: this step's failure
                return EvalResult(Status.CRASH, str(e)[:800], device=self.device, device_s=time.perf_counter() - start)
        assert self.proc is not None
        staged = None
        if isinstance(msg, Load):  # loaded from a copy of the worker's (gone once loaded: glibc and import keep theirs)
            if self.refuses(msg.backend):  # `request` sends these to python_worker: a step sent here directly
                return EvalResult(Status.LAUNCH_ERROR, "a Python candidate cannot run on a CUDA worker under the "
                                  "seccomp filter: its compiler is a program the worker would start",
                                  device=self.device, device_s=time.perf_counter() - start)
            msg = replace(msg, path=self.stage(msg.path))
            staged = Path(msg.path) if Path(msg.path).parent == self.lib else None
        try:
            return self._exchange(msg, timeout_s, start)
        finally:
            if staged is not None:
                staged.unlink(missing_ok=True)

    def _exchange(self, msg: object, timeout_s: float, start: float) -> Reply | EvalResult:
        assert self.proc is not None
        try:
            self._share(msg)
            self.conn_out.send(msg)
            try:
                raw = recv_within(self.conn_in, time.monotonic() + timeout_s)
                reply, why = valid_reply(decode(raw)), "not a reply"
            except Late as e:
                self._restart()
                return EvalResult(Status.TIMEOUT, f"no answer within {timeout_s:.0f} s (a hang or an infinite "
                                  f"loop; {e} of its reply had come); the worker was killed", device=self.device,
                                  device_s=time.perf_counter() - start)
            except (pickle.UnpicklingError, AttributeError, TypeError, ValueError, IndexError) as e:  # not EOF: death
                reply, why = None, f"{type(e).__name__}: {e}"
            if reply is None:  # only a Reply may come back: a worker that sends anything else is not trusted
                self._restart()
                return EvalResult(Status.CRASH, f"the worker broke the protocol ({why[:200]}); it was killed",
                                  device=self.device, device_s=time.perf_counter() - start)
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self.proc.wait(timeout=30)
            self.last_exit = code
            tail = self.log_tail()
            self._restart()
            if code == -signal.SIGSYS and self.confined:
                return EvalResult(Status.FORBIDDEN_IO, "killed by the sandbox (seccomp): a forbidden system call "
                                  "(a new process or program, a signal to another process, a socket, a change to "
                                  "files)", device=self.device, device_s=time.perf_counter() - start)
            status = Status.OUT_OF_MEMORY if "MemoryError" in tail or "bad_alloc" in tail else Status.CRASH
            return EvalResult(status, f"the worker died ({signal_name(code)})" + (f": {tail}" if tail else ""),
                              device=self.device, device_s=time.perf_counter() - start)
        if self.proc.poll() is not None or reply.fatal:
            self._restart()
        return reply

    def _needs(self, modules: tuple[str, ...]) -> None:
        """A confined worker that has not imported these libraries (a scan's, forge.capture.scans) is stopped, so that
        the next one imports them before its filter (forge.evaluate.child)."""
        missing = [m for m in modules if m not in self.preload]
        if self.confined and missing:
            self.preload = (*self.preload, *missing)
            self._stop()

    def _restart(self) -> None:
        """Stop the worker; the next request starts a new one."""
        self.restarts += 1
        self._stop()

    def start(self) -> None:
        """Start the process now unless it runs (else its first step does); RuntimeError when it cannot start.
        forge.evaluate.evaluator starts its workers so on their judging slots while the first candidates build
        (the first step then does not wait for Python, torch and the device to start)."""
        with self._life:
            if self._closed or (self.proc is not None and self.proc.poll() is None):
                return
            self._stop()
            self._start()

    def close(self) -> None:
        """Stop the worker and remove its directory (after a `start` under way has finished)."""
        with self._life:
            self._closed = True
            python, self._python = self._python, None
            try:
                self._stop()
                self.arena.close()
                self._dir.cleanup()
            finally:
                if self._own_id is not None:  # the user id of its own, given back (privilege.release_id)
                    release_id(self._own_id)
                    self._own_id = None
                if python is not None:
                    python.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
