"""The worker's run-time sandbox: a seccomp filter it installs on itself before it loads any candidate.

Behind the static checks and the checks of the built library (forge.evaluate.checks, forge.evaluate.elfcheck), what a
candidate's code can still reach at run time is the kernel's system-call interface. Once the worker has
imported and initialised what it needs, it installs a seccomp filter (libseccomp, through the pyseccomp
binding) that kills the whole process (SIGSYS) on:
- new processes and programs: execve, execveat, fork, vfork, clone without CLONE_THREAD (threads stay
  allowed: OpenMP; a thread still writing after a call is caught by verification); clone3 answers ENOSYS,
  so that the C library falls back to clone, whose flags the filter can read;
- other processes: kill, tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo aimed at any process but the
  worker itself, tkill, ptrace, process_vm_readv/writev, process_madvise, kcmp, pidfd calls;
- the network: socket, socketpair, connect, bind, listen, accept, accept4;
- changing files: open, openat and creat for writing or creating, openat2 (ENOSYS: it hides its flags),
  rename, link, unlink, mkdir, rmdir, chmod, chown, truncate, ftruncate, fallocate, mknod, extended
  attributes, file times and their *at forms; io_uring altogether (its operations bypass these rules);
- the system: mount, umount2, pivot_root, chroot, setns, unshare, namespaces and privileges (setuid and
  kin), module and kexec loading, reboot, swapon/off, bpf, perf_event_open, userfaultfd, keyctl, iopl,
  ioperm, personality, open_by_handle_at.
CUDA workers (unless FORGE_CUDA_SECCOMP=0; measured on an H200 and an H100: benchmarks/h200_sandbox.sh) get
the same filter with one difference: a CUDA context opens /dev/nvidia* read-write after it is made (new
mappings, new streams), and a filter cannot read the path an open names, so opens for reading and writing
stay allowed there and only those that create, truncate or append are killed (started by root, a CUDA worker
is a user of its own, as a CPU one: it can write world-writable files only). A confined
CUDA worker hands Triton and Helion candidates to an unconfined worker of its own (forge.evaluate.parent):
Triton's compiler is a program (ptxas) the worker would start.
The parent sees a worker killed by SIGSYS and reports `forbidden_io`; the harness starts a new worker and
goes on. Reading files stays allowed (dlopen must open each candidate's library): forge makes its own
process non-dumpable while workers run (forge.evaluate.parent), so a worker that is not root cannot read forge's
environment or memory through /proc. What is left open is in docs/verification.md.
"""

from __future__ import annotations

import errno
import logging
import os
import sys

log = logging.getLogger(__name__)

_CLONE_THREAD = 0x00010000
_WRITE_FLAGS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND)
_CUDA_WRITE_FLAGS = (os.O_CREAT, os.O_TRUNC, os.O_APPEND)  # /dev/nvidia* is opened O_RDWR after init
_KILLED = (
    "execve", "execveat", "fork", "vfork", "tkill", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "socket", "socketpair", "connect", "bind", "listen",
    "accept", "accept4", "creat", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
    "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "chmod", "fchmod", "fchmodat", "chown", "fchown",
    "lchown", "fchownat", "truncate", "mknod", "mknodat", "mount", "umount2", "pivot_root", "chroot", "setns",
    "unshare", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid",
    "capset", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "iopl",
    "ioperm", "personality", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "quotactl",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fchmodat2", "setxattr", "lsetxattr", "fsetxattr",
    "removexattr", "lremovexattr", "fremovexattr", "utime", "utimes", "futimesat", "utimensat", "ftruncate",
    "fallocate", "process_madvise", "kcmp",
)
_ENOSYS = ("clone3", "openat2")


def available() -> str:
    """"" when the filter can be installed here, else why not (no binding, no libseccomp, not Linux)."""
    if not sys.platform.startswith("linux"):
        return "seccomp is Linux's"
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: the binding found no libseccomp.so.2
        return f"no seccomp binding: {type(e).__name__}: {e}"
    return ""


def confine(cuda: bool = False) -> None:
    """Install the filter on this process and every thread it starts (irreversible); see the module doc
    (`cuda`: the CUDA worker's, whose opens for writing without creating stay allowed). Raises what the
    binding raises when it cannot (call `available()` first)."""
    import pyseccomp as sc

    sys.dont_write_bytecode = True  # a module imported later must not write its .pyc (a killed open)
    me = os.getpid()
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    arch = sc.system_arch()

    def rule(action: int, name: str, *args: object) -> None:  # a call this architecture lacks is skipped
        if sc.resolve_syscall(arch, name) >= 0:
            f.add_rule(action, name, *args)

    for name in _KILLED:
        rule(sc.KILL_PROCESS, name)
    for name in _ENOSYS:
        rule(sc.ERRNO(errno.ENOSYS), name)
    rule(sc.KILL_PROCESS, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):  # a signal to another process
        rule(sc.KILL_PROCESS, name, sc.Arg(0, sc.NE, me))
    for flag in _CUDA_WRITE_FLAGS if cuda else _WRITE_FLAGS:
        rule(sc.KILL_PROCESS, "open", sc.Arg(1, sc.MASKED_EQ, flag, flag))
        rule(sc.KILL_PROCESS, "openat", sc.Arg(2, sc.MASKED_EQ, flag, flag))
    f.load()
    log.info("%s worker %d confined by seccomp", "CUDA" if cuda else "CPU", me)

