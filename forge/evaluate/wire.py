"""The parent's side of the pipe to a worker: reading one message whole before a deadline, naming how a worker
died. A worker may be a candidate's: it can send a header and stall, or a length no reply has."""

from __future__ import annotations

import os
import select
import signal
import struct
import time
from multiprocessing.connection import Connection


def signal_name(code: int | None) -> str:
    """How a process ended, from its exit code (-N: signal N)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


MAX_REPLY = 16 << 20  # bytes: replies are small (tensors travel through the arena); a larger one is a broken protocol


class Late(Exception):
    """The worker's message did not arrive whole before the deadline."""


def recv_within(conn: Connection, deadline: float) -> bytes:
    """One message from `conn` (multiprocessing's framing: a 4-byte big-endian length, -1 then 8 bytes for a
    long one), read whole before `deadline` (time.monotonic()): a worker that sends a header and part of a
    message and then stalls cannot hang forge's process, as Connection.recv_bytes would. Late when it does
    not arrive in time, EOFError when the pipe closes, ValueError for a length over MAX_REPLY."""
    fd = conn.fileno()

    def read(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Late(f"{len(buf)} of {n} bytes")
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError("the worker closed its pipe")
            buf += chunk
        return bytes(buf)

    (size,) = struct.unpack("!i", read(4))
    if size == -1:
        (size,) = struct.unpack("!Q", read(8))
    if size < 0 or size > MAX_REPLY:
        raise ValueError(f"a message of {size} bytes (at most {MAX_REPLY})")
    return read(size)
