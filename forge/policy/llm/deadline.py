"""What keeps an LLM request within its deadline: a watchdog on its connection, and threads that never keep a
process alive.

The SDKs' `timeout` bounds each read of the socket, not the request: a server that sends a byte a second
never times out (a 3 s timeout took 20 s; a `--seconds 60` run was still going after 200 s). So every request
opens a connection of its own (`Connection: close`), the httpx client's `trace` extension (httpcore's, which
both SDKs use) hands its socket over as soon as it is connected, and a timer shuts that socket down at the
request's deadline: the read in progress returns at once, and the SDK raises a connection error that the
caller counts as a timeout. `shutdown` (not `close`) is safe from another thread: the descriptor stays the
request's until its own thread closes it.

`DaemonPool` runs requests on daemon threads: `concurrent.futures` joins its workers when Python exits, so a
request still waiting on a server kept the process alive past the end of its run.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


class Guard:
    """One request's deadline: the sockets it connected, shut down when the deadline comes."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False  # the deadline came while the request was still going
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace callback: keep the socket of each connection the request makes."""
        if not event.endswith(("connect_tcp.complete", "connect_unix_socket.complete")):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                late = self.fired
            if late:
                _shut(sock)

    def fire(self) -> None:
        """The deadline: every connection of the request is shut down."""
        with self._lock:
            self.fired = True
            socks = list(self._sockets)
        for sock in socks:
            _shut(sock)
        if socks:
            log.info("an LLM request was still going at its deadline: its connection was shut down")

    def cancel(self) -> None:
        """The request is over."""
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its own thread


class Watchdog:
    """Deadlines on the whole of each request an SDK client sends; `hooks` go to its httpx client."""

    def __init__(self) -> None:
        self._local = threading.local()  # the guard of the request this thread is sending

    @property
    def hooks(self) -> dict[str, list[Callable[[Any], None]]]:
        """The httpx client's event hooks (`event_hooks=`)."""
        return {"request": [self._on_request]}

    def _on_request(self, request: Any) -> None:
        guard = getattr(self._local, "guard", None)
        request.headers["Connection"] = "close"  # a connection of its own: its socket is the trace's to see
        if guard is not None:
            request.extensions = {**request.extensions, "trace": guard.trace}

    @contextmanager
    def until(self, deadline: float) -> Iterator[Guard]:
        """The requests this thread sends inside the block end by `deadline` (time.monotonic())."""
        guard = Guard(deadline)
        self._local.guard = guard
        try:
            yield guard
        finally:
            guard.cancel()
            self._local.guard = None


class DaemonPool:
    """A fixed number of daemon threads running submitted calls (a subset of ThreadPoolExecutor's interface)."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._workers = workers
        for i in range(workers):
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `fn(*args)` on a pool thread; after `shutdown` the future comes back cancelled."""
        future: Future[Any] = Future()
        with self._lock:
            if not self._closed:
                self._queue.put((future, lambda: fn(*args)))
                return future
        future.cancel()
        future.set_running_or_notify_cancel()
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as e:  # noqa: BLE001 - the future carries it to whoever waits
                future.set_exception(e)

    def shutdown(self) -> None:
        """Cancel the calls not started; the ones running finish on their own (or die with the process)."""
        with self._lock:
            self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[0].cancel():
                item[0].set_running_or_notify_cancel()
        for _ in range(self._workers):
            self._queue.put(None)
