"""Memory shared by the judge (forge's own process) and a worker: where inputs go in and outputs come out.

The judge never runs candidate code and the worker never sees the reference, so a candidate's outputs must
travel from one process to the other without a copy the worker could make up: the judge allocates every
buffer a call reads or writes in an arena both processes map, fills the inputs, poisons the outputs, and
reads them back in place once the worker says the call returned.
- CPU: one memfd per worker, created by the judge and inherited by the worker at start (no file to open:
  the worker's seccomp filter kills opens for writing); the judge sizes it with ftruncate (a call the
  worker may not make); the worker maps it once per generation (a new one whenever the judge resizes it).
- CUDA: one device allocation of the judge's own, made with CUDA's virtual memory API and exported as a
  file descriptor (forge.evaluate.devmem: legacy CUDA IPC fails when the worker is another user), which the
  worker receives over a Unix socket and maps once per generation; the worker synchronises the device
  before it answers.
A `Slot` is a place in the arena: an offset and the tensor's shape, stride and dtype. Messages carry
slots and an `ArenaRef`, never tensors.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge.capture.export import TensorMeta
from forge.evaluate import devmem

_ALIGN = 256  # bytes: what a vector load or a CUDA allocation would give
# What the random places of one step (a reset and a page, forge.evaluate.arena.Arena._drawn_place) add at most to its
# plan (16 pages of the reset's offset rounded up, and the page's offset: 130,816 bytes): the arena grows to this
# beyond a step's plan, so that the same plan again never grows it (a new mapping could put it at the addresses
# the step before it had, by its shift).
_SLACK = 2 * 256 * _ALIGN + mmap.PAGESIZE
_PROT_READ, _PROT_WRITE = 1, 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class ArenaError(RuntimeError):
    """The worker could not map the arena: it cannot serve this step or the next (the judge sent this
    generation's descriptor once), so the worker restarts (forge.evaluate.child)."""


@dataclass(frozen=True)
class Slot:
    """A tensor at `offset` bytes into the arena."""

    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @property
    def span_bytes(self) -> int:
        """Bytes from the first element to one past the last (what as_strided reaches)."""
        if any(s == 0 for s in self.shape):
            return 0
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride, strict=True))
        return span * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class ArenaRef:
    """How a worker reaches this step's arena: the memfd it inherited (CPU), or (CUDA) the descriptor the
    judge sends for this generation over the worker's socket (forge.evaluate.devmem)."""

    size: int
    generation: int  # new whenever the judge reallocates or resizes the arena: the worker maps it again
    fd: int = -1
    cuda: bool = False


def _view(base: torch.Tensor, slot: Slot) -> torch.Tensor:
    dtype = getattr(torch, slot.dtype)
    nbytes = slot.span_bytes
    raw = base[slot.offset:slot.offset + nbytes]
    if dtype == torch.bool:
        flat = raw.view(torch.bool)
    else:
        flat = raw.view(dtype) if nbytes else torch.empty(0, dtype=dtype, device=base.device)
    return flat.as_strided(slot.shape, slot.stride)


class Arena:
    """The judge's side: allocates slots for one step at a time and shares them with the worker."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.device = device
        self.fd = -1 if self.cuda else _sealed_memfd()
        self.memfds = 1  # memfds made so far: a new one (after a shrink) needs a new worker to inherit it
        self._size = 0
        self._map: mmap.mmap | None = None
        self._base: torch.Tensor | None = None
        self._slots: list[Slot] = []
        self._drawn = {"reset": -1, "page": -1}  # the last places drawn: never the same twice in a row
        self._used = self._drawn_place("reset", 0)
        self._bare = 0  # what this step planned without its random places: whether `open` grows the arena
        self._generation = 0
        self.cuda_fd = -1  # CUDA: the descriptor that exports this generation's memory (forge.evaluate.devmem)

    def plan(self, metas: Sequence[TensorMeta | tuple[tuple[int, ...], tuple[int, ...], str]]) -> list[Slot]:
        """Slots for these tensors (metas, or (shape, stride, dtype)) after those already planned this step."""
        slots = []
        for m in metas:
            shape, stride, dtype = (m.shape, m.stride, m.dtype) if isinstance(m, TensorMeta) else m
            slot = Slot(self._used, tuple(shape), tuple(stride), dtype)
            aligned = -(-slot.span_bytes // _ALIGN) * _ALIGN
            self._used += aligned
            self._bare += aligned
            slots.append(slot)
        self._slots += slots
        return slots

    @property
    def generation(self) -> int:
        """The allocation's generation (new at every reallocation)."""
        return self._generation

    @property
    def size(self) -> int:
        """Bytes planned this step."""
        return self._used

    def page(self) -> None:
        """Start what is planned next on a fresh page (inputs made read-only share no page with outputs), at
        a random offset into it and the next 15 (so that outputs, too, move from step to step)."""
        self._used = self._drawn_place("page", -(-self._used // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._bare = -(-self._bare // mmap.PAGESIZE) * mmap.PAGESIZE

    def flat(self, numel: int, dtype: torch.dtype) -> Slot:
        """A slot for a 1-D buffer of `numel` elements."""
        return self.plan([((numel,), (1,), str(dtype).removeprefix("torch."))])[0]

    def open(self) -> ArenaRef:
        """Make room for everything planned and share it (bytes from earlier steps are left as they were: every
        step fills what it reads); call `view` after."""
        # grown by the plan without its random places (the same plan again decides the same, wherever it was
        # placed: what it planned is at most that plus _SLACK), and by half again: few reallocations
        size = max(self._bare + _SLACK, self._used)
        if size > self._size or self._base is None:
            self._generation += 1
            size = max(size, self._size * 3 // 2)
            self._close_map()
            if self.cuda:
                index = torch.device(self.device).index
                index = torch.cuda.current_device() if index is None else index
                size = devmem.rounded(size, index)
                self.cuda_fd, self._base = devmem.allocate(size, index)
            else:
                os.ftruncate(self.fd, size)
                self._map = mmap.mmap(self.fd, size)
                self._base = torch.frombuffer(self._map, dtype=torch.uint8)
            self._size = size
        return ArenaRef(self._size, self._generation, fd=self.fd, cuda=self.cuda)

    @property
    def data_ptr(self) -> int:
        """The address of the arena's first byte in this process (after `open`)."""
        assert self._base is not None, "open the arena first"
        return self._base.data_ptr()

    def view(self, slot: Slot) -> torch.Tensor:
        """The tensor at a slot (after `open`)."""
        assert self._base is not None, "open the arena first"
        return _view(self._base, slot)

    def reset(self) -> None:
        """Forget this step's slots; the next step plans from a random offset (up to 64 KiB), so that a
        candidate cannot tell one step's buffers from another's by their addresses."""
        self._slots, self._used, self._bare = [], self._drawn_place("reset", 0), 0

    def _drawn_place(self, where: str, base: int) -> int:
        """`base` plus a random offset of up to 255 alignments, not the place `where` drew last: a step planned
        as the one before it (a verification's sets, each placed alone) gets other addresses for its inputs and
        its outputs, so that a kernel keyed on its pointers is caught skipping work where the judge looks for
        it (`stale_result`, forge.evaluate.repeats), not by chance elsewhere."""
        place = self._drawn[where]
        while place == self._drawn[where]:
            place = base + secrets.randbelow(256) * _ALIGN
        self._drawn[where] = place
        return place

    def _close_map(self) -> None:
        self._base = None  # CUDA: unmapped with its last view (forge.evaluate.devmem)
        if self.cuda_fd >= 0:
            os.close(self.cuda_fd)
            self.cuda_fd = -1
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a tensor still views it: it goes when that tensor does
                pass
            self._map = None

    def shrink(self, keep_bytes: int = 1 << 30) -> None:
        """Give the arena's memory back when it grew past `keep_bytes` (between requests); the next `open`
        allocates a new one (a CUDA arena's memory goes once the worker maps the new one, or dies)."""
        if self._size > keep_bytes:
            self._close_map()
            if not self.cuda:  # sealed against shrinking: a new memfd, which a new worker inherits (the old
                os.close(self.fd)  # one's pages go with the last process that maps it)
                self.fd = _sealed_memfd()
                self.memfds += 1
            self._size = 0

    def close(self) -> None:
        """Release the arena."""
        self._close_map()
        self._base = None
        if self.cuda:
            devmem.release()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _sealed_memfd() -> int:
    """A memfd that cannot shrink, and takes no further seals: a worker that truncated the arena under forge's
    mapping would make forge's next access to it a SIGBUS, and one that sealed it against growing would stop
    the judge's next resize."""
    fd = os.memfd_create("forge-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


class Mapped:
    """The worker's side of the arena: tensors at slots. The mapping is kept across steps until the judge
    reallocates the arena (a new generation), so a step costs no mapping and no descriptor to receive."""

    _current: tuple[int, Any, torch.Tensor] | None = None  # (generation, mmap or None, base) of this process

    def __init__(self, ref: ArenaRef, shared: socket.socket | None = None) -> None:
        """`shared`: the socket a CUDA worker receives its arena's descriptors on."""
        if Mapped._current is None or Mapped._current[0] != ref.generation:
            Mapped._current = None  # the old mapping goes with its last view (an mmap unmaps when freed)
            Mapped._current = (ref.generation, *_map(ref, shared))
        self.base = Mapped._current[2]

    def view(self, slot: Slot) -> torch.Tensor:
        """The tensor at a slot."""
        return _view(self.base, slot)

    def views(self, slots: Sequence[Slot]) -> list[torch.Tensor]:
        """The tensors at these slots."""
        return [_view(self.base, s) for s in slots]

    def protect(self, slots: Sequence[Slot], writable: bool) -> bool:
        """Make the pages holding these slots read-only (or writable again); False where it cannot (CUDA)."""
        slots = [s for s in slots if s.span_bytes]
        if self.base.is_cuda or not slots:
            return False
        lo = min(s.offset for s in slots) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = -(-max(s.offset + s.span_bytes for s in slots) // mmap.PAGESIZE) * mmap.PAGESIZE
        prot = _PROT_READ | (_PROT_WRITE if writable else 0)
        if hi > lo and _libc().mprotect(ctypes.c_void_p(self.base.data_ptr() + lo), ctypes.c_size_t(hi - lo),
                                        ctypes.c_int(prot)) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
        return True

    def close(self) -> None:
        """End of the step (the mapping stays for the next)."""
        del self.base


def _map(ref: ArenaRef, shared: socket.socket | None) -> tuple[mmap.mmap | None, torch.Tensor]:
    if ref.cuda:
        if shared is None:
            raise ArenaError("a CUDA arena needs the socket its descriptor comes over")
        try:
            fd = devmem.receive(shared, ref.generation)
        except (OSError, EOFError) as e:  # TimeoutError among them: the judge sent nothing
            raise ArenaError(f"no descriptor for arena generation {ref.generation}: {e}") from e
        try:
            return None, devmem.attach(fd, ref.size)  # the worker sees its one GPU as device 0
        except RuntimeError as e:
            raise ArenaError(f"could not map the arena: {e}") from e
        finally:
            os.close(fd)
    # populated at once: the page faults are not charged to the first call of the candidate
    m = mmap.mmap(ref.fd, ref.size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    return m, torch.frombuffer(m, dtype=torch.uint8)
