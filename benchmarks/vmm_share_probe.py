"""Device memory shared across users through CUDA's virtual memory API (issue 13).

Legacy CUDA IPC (torch.multiprocessing) fails between root and `nobody` whichever side exports
(benchmarks/ipc_owner_probe.py: "mapping of buffer object failed"). This probe shares memory made with
cuMemCreate as a POSIX file descriptor instead: judge_exports passes the fd to the child at start (pass_fds);
worker_exports has the child make it and this process take the fd with pidfd_getfd. After the child is killed
this process reads and writes the buffer again and runs a matmul. Run as root on a GPU; JSON to argv[1].
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import stamp  # noqa: E402

N = 1 << 24
_cuda = ctypes.CDLL("libcuda.so.1")


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _ok(name: str, *args: object) -> None:
    rc = getattr(_cuda, name)(*args)
    if rc != 0:
        msg = ctypes.c_char_p()
        _cuda.cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"{name}: {rc} {msg.value}")


def _prop() -> _Prop:
    p = _Prop()
    p.type, p.requestedHandleTypes = 1, 1  # pinned (device) memory, POSIX file descriptor
    p.location.type, p.location.id = 1, 0  # device 0
    return p


def _size() -> int:
    gran = ctypes.c_size_t()
    _ok("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(_prop()), 0)
    return -(-N // gran.value) * gran.value


def create() -> tuple[int, int, int]:
    """(fd, handle, size): new device memory exported as a file descriptor."""
    size = _size()
    handle = ctypes.c_ulonglong()
    _ok("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(_prop()), ctypes.c_ulonglong(0))
    fd = ctypes.c_int()
    _ok("cuMemExportToShareableHandle", ctypes.byref(fd), handle, 1, ctypes.c_ulonglong(0))
    return fd.value, handle.value, size


def import_fd(fd: int) -> int:
    handle = ctypes.c_ulonglong()
    _ok("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), 1)
    return handle.value


def mapped(handle: int, size: int) -> torch.Tensor:
    """The memory as a uint8 tensor of this process."""
    ptr = ctypes.c_ulonglong()
    _ok("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
        ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
    _ok("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
        ctypes.c_ulonglong(0))
    acc = _Access()
    acc.location.type, acc.location.id, acc.flags = 1, 0, 3  # device 0, read and write
    _ok("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(acc), ctypes.c_size_t(1))

    class _Cai:
        __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr.value, False),
                                    "version": 3, "strides": None}

    return torch.as_tensor(_Cai(), device="cuda")


def _child(mode: str, fd: int) -> None:
    torch.empty(1, device="cuda")
    if mode == "export":
        fd, handle, size = create()
        buf = mapped(handle, size)
        buf.fill_(7)
        torch.cuda.synchronize()
        print(json.dumps({"fd": fd, "size": size}), flush=True)
        sys.stdin.readline()
        torch.cuda.synchronize()
        print(json.dumps({"saw_9": int((buf[:N] == 9).sum())}), flush=True)
        time.sleep(3600)
    try:
        buf = mapped(import_fd(fd), _size())
        seen = int((buf[:N] == 7).sum())
        buf.fill_(9)
        torch.cuda.synchronize()
        print(json.dumps({"status": "ok", "saw_7": seen}), flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports it
        print(json.dumps({"status": "error", "error": repr(e)[:300]}), flush=True)


def _start(mode: str, user: str, fd: int = -1) -> subprocess.Popen:
    ent = pwd.getpwnam(user)

    def drop() -> None:
        os.setgroups([])
        os.setresgid(ent.pw_gid, ent.pw_gid, ent.pw_gid)
        os.setresuid(ent.pw_uid, ent.pw_uid, ent.pw_uid)

    return subprocess.Popen([sys.executable, __file__, "--child", mode, str(fd)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, pass_fds=(fd,) if fd >= 0 else (),
                            preexec_fn=drop if user != "root" else None, env={**os.environ, "HOME": "/tmp"})


def judge_exports(user: str) -> dict:
    fd, handle, size = create()
    buf = mapped(handle, size)
    buf.fill_(7)
    torch.cuda.synchronize()
    p = _start("import", user, fd)
    got = json.loads(p.stdout.readline())
    p.wait(60)
    torch.cuda.synchronize()
    os.close(fd)
    return {"case": "judge_exports", "child": user, **got, "judge_sees_9": int((buf[:N] == 9).sum())}


def worker_exports(user: str) -> dict:
    p = _start("export", user)
    row: dict = {"case": "worker_exports", "child": user}
    try:
        got = json.loads(p.stdout.readline())
        pidfd = os.pidfd_open(p.pid)
        fd = _pidfd_getfd(pidfd, got["fd"])
        buf = mapped(import_fd(fd), got["size"])
        row["judge_saw_7"] = int((buf[:N] == 7).sum())
        buf.fill_(9)
        torch.cuda.synchronize()
        p.stdin.write("go\n")
        p.stdin.flush()
        row.update(json.loads(p.stdout.readline()))
        p.kill()
        p.wait(60)
        time.sleep(1)
        buf.fill_(3)
        torch.cuda.synchronize()
        row["after_kill_reads_3"] = int((buf[:N] == 3).sum())
        a = torch.randn(2048, 2048, device="cuda")
        row["after_kill_matmul_ok"] = bool(torch.isfinite(a @ a).all())
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - the probe reports it
        row["status"], row["error"] = "error", repr(e)[:300]
        p.kill()
    return row


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd on x86-64
    if got < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return got


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        return
    torch.empty(1, device="cuda")
    rows = []
    for user in ("root", "nobody"):
        for case in (judge_exports, worker_exports):
            try:
                rows.append(case(user))
            except Exception as e:  # noqa: BLE001 - the probe reports it
                rows.append({"case": case.__name__, "child": user, "status": "error", "error": repr(e)[:300]})
            print(rows[-1], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({**stamp("cuda"), "uid": os.geteuid(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
