"""The key holder: under `forge optimize`, the only process with API keys, and one that never loads a kernel.

Important: the process that loads kernels holds no secret. `forge optimize` started with a credential in its
environment (an `*_API_KEY`, a token, ...) runs the job in a child process whose environment has none
(`child_env`); the process the user started stays behind as the key holder: it makes the LLM client (the
key goes there and nowhere else), makes itself non-dumpable, blanks the credentials in its own
environment block (what /proc/<pid>/environ shows, even to root), and answers the child's requests over
a socket pair until the child exits. The child's LLM client (`RemoteChat`) sends each request there;
the search, the workers, the compilers and the end-to-end check of the found kernels (which loads them
into the child) see no key. The key holder decides what is sent: it reserves each request's worst cost
under --max-usd and bounds its time, whatever the child asks. Messages are JSON lines, never pickles (the
child runs kernels: what it sends is untrusted). See docs/llm.md and docs/verification.md.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

from forge.evaluate.sandbox import nondumpable
from forge.kernel import Status
from forge.policy.llm.deadline import DaemonPool
from forge.policy.llm.limits import Ledger, LLMError, NotSent
from forge.policy.llm.prices import Price
from forge.policy.llm.providers import Chat, ProviderSpec, Reply, RetryConfig

log = logging.getLogger(__name__)

ENV = "FORGE_LLM_BROKER"  # in the child: the descriptor of its end of the socket pair
ISOLATED = "FORGE_ISOLATED"  # in the child: it runs the job (it never starts a key holder itself)
# Names that hold credentials. Narrower than the workers' rule (forge.evaluate.sandbox: an allowlist):
# the child loads the user's model and needs its settings (HF_HOME, TORCH_HOME, FORGE_DB, ...).
# (AWS_SECRET_ACCESS_KEY, AZURE_CLIENT_SECRET, GOOGLE_APPLICATION_CREDENTIALS are caught; AWS_CA_BUNDLE is not.)
_CREDENTIAL = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|_PASS$|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|"
                         r"COOKIE|AUTH|^OPENAI|^ANTHROPIC)", re.I)
_MAX_LINE = 64 << 20  # a request larger than this ends the session (a conversation is a few hundred kB)
_GRACE_S = 10.0  # the child waits this long past its deadline for the key holder's answer


def is_credential(name: str) -> bool:
    """True for an environment variable that may hold a credential (kept from the process that runs kernels)."""
    return bool(_CREDENTIAL.search(name))


def needs_isolation() -> bool:
    """True when this process holds a credential and is not already the isolated child (Linux and macOS)."""
    return ISOLATED not in os.environ and any(is_credential(k) for k in os.environ)


def child_env() -> dict[str, str]:
    """The child's environment: this one without credentials, marked as isolated."""
    env = {k: v for k, v in os.environ.items() if not is_credential(k)}
    env[ISOLATED] = "1"
    return env


def run_isolated(argv: list[str], chat: Chat | None, seconds: float | None = None) -> int:
    """Run `forge ARGV` in a child without credentials; with `chat`, answer its LLM requests until it exits or
    closes its end (it does when its search is over), none outlasting the run's `seconds` from now whatever the
    child asks. Returns the child's exit status."""
    deadline = time.monotonic() + seconds if seconds else None
    env = child_env()
    cmd = [sys.executable, "-m", "forge.cli", *argv]
    ours, theirs = socket.socketpair() if chat is not None else (None, None)
    fds: tuple[int, ...] = ()
    if theirs is not None:
        env[ENV] = str(theirs.fileno())
        fds = (theirs.fileno(),)
    proc = subprocess.Popen(cmd, env=env, pass_fds=fds)  # before SIGINT is ignored here: the child inherits that
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None  # Ctrl-C: the child's
    try:
        if theirs is not None:
            theirs.close()
        nondumpable()  # a process of the same user cannot read this one's memory or environment
        blank_credentials()  # nor can root read the keys in /proc/<pid>/environ
        if ours is not None and chat is not None:
            serve(ours, chat, deadline=deadline)
        return proc.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def blank_credentials() -> int:
    """Overwrite the credentials in this process's original environment block with zeros (Linux); how many.

    os.environ and the C library's `environ` are copies or pointers: deleting a variable leaves its text in
    the block the kernel shows as /proc/<pid>/environ. Python's own copy (os.environ) is left as it is."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5): env_start, env_end
    except (OSError, IndexError, ValueError):
        return 0
    if not 0 < start < end:
        return 0
    block = ctypes.string_at(start, end - start)
    blanked, offset = 0, 0
    for entry in block.split(b"\0"):
        name = entry.split(b"=", 1)[0].decode(errors="replace")
        if b"=" in entry and is_credential(name):
            ctypes.memset(start + offset, 0, len(entry))
            blanked += 1
        offset += len(entry) + 1
    return blanked


# -- the key holder's side -------------------------------------------------------------------------------
def serve(sock: socket.socket, chat: Chat, workers: int = 16, deadline: float | None = None) -> None:
    """Answer JSON-line requests on `sock` with `chat` until the other end closes it; no request outlasts
    `deadline` (time.monotonic()), whatever the other end asks. Requests still going when it closes are left
    to end at their deadline (daemon threads: they never keep this process alive)."""
    pool = DaemonPool(workers, "forge-keyholder")
    lock = threading.Lock()
    reader = sock.makefile("rb")
    try:
        while True:
            line = reader.readline(_MAX_LINE)
            if not line or not line.endswith(b"\n"):
                break  # the child is done with the LLM, or exited (or sent a line too long to be a request)
            try:
                req = _request(json.loads(line))
            except (ValueError, TypeError, KeyError) as e:
                log.warning("key holder: a malformed request ignored (%s)", e)
                continue
            pool.submit(_answer, chat, req, sock, lock, deadline)
    finally:
        pool.shutdown()
        reader.close()
        try:
            sock.shutdown(socket.SHUT_RDWR)  # answers still going find no one to send to
        except OSError:
            pass
        sock.close()


def _request(msg: Any) -> dict[str, Any]:
    """A request checked field by field (it comes from the process that runs kernels); ValueError if not one."""
    if not isinstance(msg, dict) or not isinstance(msg.get("id"), int) or not isinstance(msg.get("system"), str):
        raise ValueError("not a request")
    messages = msg.get("messages")
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            and set(m) == {"role", "content"} for m in messages):
        raise ValueError("bad messages")
    max_tokens, left = msg.get("max_tokens"), msg.get("seconds_left")
    if not isinstance(max_tokens, int) or not 0 < max_tokens <= 1_000_000:
        raise ValueError("bad max_tokens")
    if left is not None and (not isinstance(left, (int, float)) or not math.isfinite(left)):
        raise ValueError("bad seconds_left")
    return {"id": msg["id"], "system": msg["system"], "messages": messages, "max_tokens": max_tokens,
            "seconds_left": left}


def _answer(chat: Chat, req: dict[str, Any], sock: socket.socket, lock: threading.Lock,
            run_deadline: float | None) -> None:
    asked = None if req["seconds_left"] is None else time.monotonic() + float(req["seconds_left"])
    deadline = min((d for d in (asked, run_deadline) if d is not None), default=None)  # the child asks less only
    out: dict[str, Any] = {"id": req["id"]}
    try:
        out["reply"] = asdict(chat.complete(req["system"], req["messages"], req["max_tokens"], deadline=deadline))
    except LLMError as e:
        out.update(error=str(e), status=e.status.value, usd=e.usd, not_sent=isinstance(e, NotSent))
    except Exception as e:  # noqa: BLE001 - a bug here must not end the session
        log.exception("key holder: request failed")
        out.update(error=f"{type(e).__name__}: {e}", status=Status.PROVIDER_ERROR.value, usd=0.0, not_sent=False)
    out["spent"], out["least_worst"] = chat.ledger.spent, chat.least_worst
    data = (json.dumps(out) + "\n").encode()
    with lock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the child is gone


# -- the child's side --------------------------------------------------------------------------------------
class _Channel:
    """The child's end of the socket pair: requests out, answers dispatched to their waiters."""

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)  # workers and compilers do not get it
        self.sock = socket.socket(fileno=fd)
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._read, name="forge-llm-channel", daemon=True).start()

    def ask(self, body: dict[str, Any], wait: float | None) -> dict[str, Any]:
        """The key holder's answer to one request (raises LLMError when none comes in `wait` seconds)."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self.closed:
                raise NotSent("the search is over: no more LLM requests")
            rid = next(self._ids)
            self._pending[rid] = future
            try:
                self.sock.sendall((json.dumps({"id": rid, **body}) + "\n").encode())
            except OSError as e:
                self._pending.pop(rid, None)
                raise LLMError(f"the key holder is gone ({e})") from None
        try:
            return future.result(timeout=wait)
        except futures.TimeoutError:
            raise LLMError("no answer from the key holder by the search's deadline") from None
        finally:
            with self._lock:
                self._pending.pop(rid, None)

    def close(self) -> None:
        """No more requests: the socket is shut down (the key holder sees its end and stops) and its descriptor
        becomes /dev/null, so nothing loaded into this process later (the end-to-end check loads the found
        kernels) can reach the key holder through it, nor find the number reused by a file; waiters get an
        error, and so does a later `ask`."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, self.sock.fileno(), inheritable=False)
        finally:
            os.close(null)

    def _read(self) -> None:
        reader = self.sock.makefile("rb")
        for line in reader:
            try:
                msg = json.loads(line)
                with self._lock:
                    future = self._pending.get(msg["id"])
            except (ValueError, KeyError, TypeError):
                continue
            if future is not None and not future.done():
                future.set_result(msg)
        with self._lock:  # the key holder is gone: every waiter learns it now
            for future in self._pending.values():
                if not future.done():
                    future.set_result({"error": "the key holder is gone", "status": "provider_error", "usd": 0.0})


@functools.lru_cache(maxsize=1)
def _channel() -> _Channel:
    return _Channel(int(os.environ[ENV]))


class RemoteChat(Chat):
    """The child's client: every request goes to the key holder, which sends it (this process has no key)."""

    def __init__(self, spec: ProviderSpec, retry: RetryConfig, price: Price | None = None,
                 max_usd: float | None = None) -> None:
        self.spec = spec
        self.retry = retry
        self.price = price or Price(0.0, 0.0)
        self.ledger = Ledger(max_usd)  # a mirror of the key holder's: its spending, for the search's stop
        self.least_worst = 0.0
        self._channel = _channel()

    def complete(self, system: str, messages: list[dict[str, str]], max_tokens: int = 8192,
                 deadline: float | None = None, sleep: Any = None) -> Reply:
        """The key holder's answer (see Chat.complete, which it runs there)."""
        left = None if deadline is None else deadline - time.monotonic()
        wait = None if left is None else max(0.0, left) + _GRACE_S
        msg = self._channel.ask({"system": system, "messages": messages, "max_tokens": max_tokens,
                                 "seconds_left": left}, wait)
        self.ledger.settle(0.0, max(0.0, float(msg.get("spent", 0.0)) - self.ledger.spent))
        self.least_worst = float(msg.get("least_worst", self.least_worst))
        if "reply" in msg:
            return Reply(**msg["reply"])
        e: LLMError = NotSent(str(msg.get("error"))) if msg.get("not_sent") else LLMError(str(msg.get("error")))
        e.status = Status(msg.get("status", Status.PROVIDER_ERROR.value))
        e.usd = float(msg.get("usd", 0.0))
        raise e

    def check(self) -> None:
        """Nothing: the key holder checked the key before it started this process."""

    def close(self) -> None:
        """The search is over: the connection to the key holder is closed for good (see _Channel.close)."""
        self._channel.close()
