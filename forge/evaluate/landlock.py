"""Landlock: a worker writes only beneath its own folders and to the devices it needs (issue 13).

The seccomp filter (forge.evaluate.confine) cannot read the path an open names, so a CUDA worker's filter lets
opens for reading and writing through (a CUDA context opens /dev/nvidia* read-write after it is made), and the
worker for Triton and Helion candidates on the GPU has no filter at all (their compiler is a program). Either
could change in place any file its user may write: world-writable files, for a worker that gave up root.
Landlock (Linux 5.13 and later) is a rule set a process puts on itself and every process it starts, with no
privilege: here, in the worker's preexec (forge.evaluate.sandbox.limits), after root is given up and before
Python starts, so that the whole worker is under it from its first instruction. What it handles is writing
(writing to, truncating, removing, renaming into or making files, folders, devices, sockets and links);
reading and executing stay as the user's permissions and the mount namespace say (forge.evaluate.privilege).
Allowed: everything beneath the worker's own folders (its scratch, with HOME, TMPDIR and the caches in it), its
own /proc folder and /dev/shm (SHARED: CUDA needs both), and writing to /dev/null and the NVIDIA devices.
No maintained Python binding of Landlock exists (the PyPI `landlock` package has development releases only),
so the three system calls are called through ctypes. Where the kernel lacks Landlock (or a container's filter
refuses it), `abi()` is 0 and the worker runs without (logged once), as it does on ABI 1 (for_worker);
FORGE_LANDLOCK=0 turns it off (FORGE_CUDA_LANDLOCK=0 on CUDA workers only).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# System call numbers: the same on x86_64 and aarch64 (added after the tables were unified)
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# Access rights (include/uapi/linux/landlock.h) and the ABI that added them
_WRITE_FILE = 1 << 1
_DIRS = {1: (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11)
         | (1 << 12),  # write, remove dir and file, make char, dir, reg, sock, fifo, block, sym
         2: 1 << 13,  # refer (link or rename into another folder)
         3: 1 << 14}  # truncate
_TRUNCATE = 1 << 14
DEVICES = ("/dev/null", "/dev/nvidia*", "/dev/nvidia-caps/*")  # what a worker writes to outside its folders
# Folders a worker writes in besides its own: the CUDA driver's shared memory and the process's own /proc files
# (without them cudaGetDeviceCount fails with error 304, "OS call failed", on an H100 at 8b3ca16). /proc/self is
# opened in the worker's preexec: its own folder there. In /dev/shm it reaches only files its user may write,
# which for a worker of its own user id are its own and the world-writable ones.
SHARED = ("/dev/shm", "/proc/self")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Writable:
    """What a worker may write: beneath these folders, and these files (devices)."""

    folders: tuple[str, ...]
    files: tuple[str, ...]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version this kernel offers; 0 where it has none, refuses it, or FORGE_LANDLOCK=0."""
    return 0 if os.environ.get("FORGE_LANDLOCK", "1") == "0" else _kernel_abi()


@functools.cache
def _kernel_abi() -> int:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if version <= 0:
        log.warning("this kernel offers no Landlock (%s): workers may write wherever their user may",
                    os.strerror(ctypes.get_errno()))
    return max(0, int(version))


def for_worker(scratch: Path, triton_cache: str) -> Writable | None:
    """What a worker may write: its scratch folder (HOME, TMPDIR, caches), Triton's cache where that is
    elsewhere (made here first: the worker may make nothing outside) and the devices of DEVICES that exist
    (read in forge's process, before the worker starts). None where abi() is below 2 (Linux before 5.19)."""
    if abi() < 2:  # ABI 1 refuses every rename across folders: Triton's cache moves each entry into place so
        if abi() == 1:
            _too_old()
        return None
    if triton_cache and not Path(triton_cache).is_relative_to(scratch):
        os.makedirs(triton_cache, exist_ok=True)
    files = sorted({f for pattern in DEVICES for f in glob.glob(pattern) if not os.path.isdir(f)})
    return Writable(tuple(os.path.realpath(f) for f in (str(scratch), triton_cache) if f), tuple(files))


@functools.cache
def _too_old() -> None:
    log.warning("this kernel's Landlock is ABI 1 (Linux 5.13-5.18), which refuses the renames Triton's cache "
                "makes: workers run without it")


def _handled(version: int) -> int:
    return functools.reduce(int.__or__, (bits for v, bits in _DIRS.items() if v <= version), 0)


def restrict(allowed: Writable) -> None:
    """In a worker's preexec: this process, and every one it starts, may write only what `allowed` names.
    Nothing where abi() is 0; OSError where a step fails (the parent reports the start as failed)."""
    version = abi()
    if not version:
        return
    handled = _handled(version)
    attr = _RulesetAttr(handled)
    fd = _libc().syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, access in [*((f, handled) for f in (*allowed.folders, *SHARED)),
                             *((f, _WRITE_FILE | (_TRUNCATE if version >= 3 else 0)) for f in allowed.files)]:
            _allow(fd, path, access)
        if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # set already where root was given up
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if _libc().syscall(_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def _allow(ruleset: int, path: str, access: int) -> None:
    """One rule: `access` beneath `path` (a folder) or on it (a file); a path that is gone is skipped."""
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        rule = _PathBeneathAttr(access, target)
        if _libc().syscall(_ADD_RULE, ruleset, ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                           ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(target)
