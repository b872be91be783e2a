"""Device memory two processes of different users share: CUDA's virtual memory API, through a file descriptor.

The judge (forge's process, root when forge runs as root) and a CUDA worker (a user of its own then,
forge.evaluate.privilege) both map the arena. Legacy CUDA IPC (`cudaIpcGetMemHandle`, what
torch.multiprocessing uses) fails between two users whichever side exports ("mapping of buffer object
failed", benchmarks/ipc_owner_probe.py); memory made with `cuMemCreate` and exported as a POSIX file
descriptor maps in either, and stays valid in one when the other dies (benchmarks/vmm_share_probe.py, on an
H100 on 2026-12-06). The judge makes the memory and keeps the descriptor; a worker gets a duplicate over a
Unix socket (SCM_RIGHTS: no path, no ptrace rights over forge's process).
A mapping is a uint8 tensor whose owner unmaps the range once the last view of it is gone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import socket
import struct

import torch

log = logging.getLogger(__name__)

_PINNED, _POSIX_FD, _ON_DEVICE, _READ_WRITE = 1, 1, 1, 3  # CUmemAllocationType, ...HandleType, CUmemLocationType


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def ready() -> None:
    """Load the driver's library now (a worker, before its seccomp filter)."""
    _driver()


def _check(name: str, *args: object) -> None:
    rc = getattr(_driver(), name)(*args)
    if rc != 0:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(text))
        raise RuntimeError(f"{name} failed: {rc} ({(text.value or b'').decode()})")


def _prop(index: int) -> _Prop:
    p = _Prop()
    p.type, p.requestedHandleTypes = _PINNED, _POSIX_FD
    p.location.type, p.location.id = _ON_DEVICE, index
    return p


def rounded(size: int, index: int) -> int:
    """`size` rounded up to the allocation granularity of device `index`."""
    gran = ctypes.c_size_t()
    _check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(_prop(index)), 0)
    return -(-size // gran.value) * gran.value


class _Mapping:
    """A mapped range; released (after the device is idle) once the last tensor viewing it is gone. The
    release is queued, not done in `__del__` (which may run on any thread, during a CUDA graph's capture): the
    owner's next `allocate`, `attach` or `release` does it."""

    def __init__(self, ptr: int, size: int, index: int) -> None:
        self.ptr, self.size, self.index = ptr, size, index
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}

    def __del__(self) -> None:
        _dead.append((self.ptr, self.size, self.index))  # list.append: atomic under the GIL


_dead: list[tuple[int, int, int]] = []  # ranges whose last view is gone, to unmap


def release() -> None:
    """Unmap the ranges whose last view is gone (after their device is idle)."""
    while _dead:
        try:
            ptr, size, index = _dead.pop()
        except IndexError:  # another judging thread took the last one
            return
        try:
            torch.cuda.synchronize(index)  # no kernel still reads or writes the range
            _check("cuMemUnmap", ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
            _check("cuMemAddressFree", ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
        except RuntimeError as e:  # the range stays mapped until the process ends: memory lost, not corrupted
            log.warning("could not release an arena mapping of %d bytes: %s", size, e)


def _map(handle: int, size: int, index: int) -> torch.Tensor:
    """Map an allocation handle and release it (the mapping keeps the memory); a uint8 tensor over it."""
    ptr = ctypes.c_ulonglong()
    try:
        _check("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
               ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        try:
            _check("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                   ctypes.c_ulonglong(0))
        except RuntimeError:
            _check("cuMemAddressFree", ptr, ctypes.c_size_t(size))
            raise
    finally:
        _check("cuMemRelease", ctypes.c_ulonglong(handle))
    owner = _Mapping(ptr.value, size, index)  # from here the range is unmapped after its last view
    access = _Access()
    access.location.type, access.location.id, access.flags = _ON_DEVICE, index, _READ_WRITE
    _check("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
    t = torch.as_tensor(owner, device=f"cuda:{index}")
    if t.data_ptr() != ptr.value:  # a copy (another device inferred from the pointer): not memory both map
        raise RuntimeError(f"the mapping at {ptr.value:#x} came back as a copy on {t.device}")
    return t


def allocate(size: int, index: int) -> tuple[int, torch.Tensor]:
    """(fd, tensor): `size` bytes (a multiple of `rounded`) on device `index`, exported as a file descriptor
    (the caller closes it) and mapped here."""
    release()
    torch.cuda.synchronize(index)  # the device's primary context current on this thread
    handle = ctypes.c_ulonglong()
    _check("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(_prop(index)),
           ctypes.c_ulonglong(0))
    fd = ctypes.c_int(-1)
    try:
        _check("cuMemExportToShareableHandle", ctypes.byref(fd), handle, _POSIX_FD, ctypes.c_ulonglong(0))
    except RuntimeError:
        _check("cuMemRelease", handle)
        raise
    os.set_inheritable(fd.value, False)  # no program forge starts gets it
    try:
        return fd.value, _map(handle.value, size, index)
    except RuntimeError:
        os.close(fd.value)
        raise


def attach(fd: int, size: int, index: int = 0) -> torch.Tensor:
    """The memory a file descriptor from `allocate` (in any process) exports, mapped in this one."""
    release()
    torch.cuda.synchronize(index)
    handle = ctypes.c_ulonglong()
    _check("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD)
    return _map(handle.value, size, index)


_TAG = struct.Struct("!q")


def send(sock: socket.socket, generation: int, fd: int) -> None:
    """Hand `fd` (the arena of this generation) to the process at the socket's other end."""
    socket.send_fds(sock, [_TAG.pack(generation)], [fd])


def receive(sock: socket.socket, generation: int) -> int:
    """The descriptor sent for `generation` (a SOCK_SEQPACKET socket: one message a send); those of earlier
    generations still queued (sent for a step that failed before it mapped them) are closed."""
    while True:
        data, fds, _, _ = socket.recv_fds(sock, _TAG.size, 1)
        if not data:
            raise EOFError("the judge closed the arena's socket")
        found = _TAG.unpack(data)[0] if len(data) == _TAG.size else None
        if found == generation and fds:
            return fds[0]
        for f in fds:
            os.close(f)

