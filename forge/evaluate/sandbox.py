"""The sandbox of untrusted work: environments by allowlist, resource limits and a network namespace for
workers, a non-dumpable forge (forge.evaluate.confine has the workers' system-call filter,
forge.evaluate.privilege their unprivileged user)."""

from __future__ import annotations

import ctypes
import os
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path

from forge.evaluate.landlock import Writable, restrict
from forge.evaluate.privilege import Drop, process_uids
from forge.evaluate.privilege import apply as give_up_root

# What a worker or a compiler may see (issue 13: an allowlist, not a denylist): these names, and names with
# these prefixes (thread counts and library settings of OpenMP, MKL, OpenBLAS, CUDA and Triton). Anything
# else (a `*_PASS`, a `DATABASE_URL` with a password, FORGE_DB) stays in forge's own process.
ALLOWED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP", "USER", "LOGNAME",
                     "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CXX", "CC", "PYTHONPATH", "VIRTUAL_ENV",
                     "PYTHONHASHSEED", "FORGE_CACHE", "XDG_CACHE_HOME", "LIBRARY_PATH", "CPATH",
                     "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"})
ALLOWED_PREFIXES = ("LC_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "CUDA_", "NVIDIA_", "TRITON_")
# Names that hold credentials, refused even when allowed above (a CUDA_..._TOKEN is still a token).
_SECRET = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|_PASS$|CREDENTIAL|AUTH|SESSION|COOKIE|"
                     r"PRIVATE_KEY|ACCESS_KEY|^AWS_|^AZURE_|^GOOGLE_APPLICATION|^OPENAI|^ANTHROPIC|^HF_|"
                     r"^HUGGING_FACE|^GH_|^GITHUB_|^NPM_|^PYPI|URL$|DSN$)", re.I)


def is_secret(name: str) -> bool:
    """True for an environment variable name that may hold a credential."""
    return bool(_SECRET.search(name))


def allowed(name: str) -> bool:
    """True for a variable a worker or compiler may see: on the allowlist and not a credential's name."""
    return (name in ALLOWED or name.startswith(ALLOWED_PREFIXES)) and not is_secret(name)


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The allowed part of the current environment (see ALLOWED), plus `extra` (forge's own settings)."""
    env = {k: v for k, v in os.environ.items() if allowed(k)}
    env.update(extra or {})
    return env


_CLONE_NEWNET = 0x40000000


def worker_env(device: str, confined: bool, root: str, scratch: Path, own_cache: str | None,
               triton_sub: str | None) -> dict[str, str]:
    """A worker's environment besides the allowlist (`scrubbed_env`): forge's checkout (`root`) importable, HOME,
    TMPDIR and Inductor's cache in its own folder (credentials under the user's home, ~/.aws, ~/.netrc, tokens,
    are not a path away; Landlock lets it write there), Triton's cache where it was (`own_cache` when the worker
    is not forge's user; `triton_sub` a subfolder of its own), the one GPU it sees, and under the CUDA filter
    no cache file to create (an O_CREAT the filter kills): the driver's for JIT-compiled PTX, PyTorch's for its
    jiterator's kernels (gcd, i1, zeta: eager, timed there)."""
    triton_cache = own_cache or os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    if own_cache is None and triton_sub:
        triton_cache = str(Path(triton_cache) / triton_sub)
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
             "PYTHONUNBUFFERED": "1", "HOME": str(scratch), "TRITON_CACHE_DIR": triton_cache,
             "TMPDIR": str(scratch), "TMP": str(scratch), "TEMP": str(scratch),
             "XDG_CACHE_HOME": str(scratch / ".cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")}
    if device.startswith("cuda"):
        index = device.split(":")[1] if ":" in device else "0"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra["CUDA_VISIBLE_DEVICES"] = visible.split(",")[int(index)] if visible else index
        if confined:
            extra["CUDA_CACHE_DISABLE"] = "1"
            extra["USE_PYTORCH_KERNEL_CACHE"] = "0"
    return extra


def limits(memory_bytes: int | None, cpu_seconds: int | None, own_network: bool = True,
           drop: Drop | None = None, allowed: Writable | None = None) -> Callable[[], None]:
    """A preexec function for a worker: its own session, an address-space and a CPU-time limit, (Linux, as
    root, `own_network`) a network namespace of its own, which has no interface but a loopback that is
    down: no network at all, sockets or not; then, with `drop`, root given up (forge.evaluate.privilege).
    Where the namespace cannot be made (no privilege, a container without it) the worker runs without. Last,
    with `allowed`, Landlock: it writes only there (forge.evaluate.landlock)."""

    def apply() -> None:
        os.setsid()  # Ctrl-C in the terminal reaches the parent only
        if own_network and sys.platform.startswith("linux") and os.geteuid() == 0:
            ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)  # a failure leaves the network as it was
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop is not None:
            give_up_root(drop)  # what needs root is done
        if allowed is not None:
            try:
                restrict(allowed)
            except OSError as e:  # no start without it: the parent's fallback for a failed drop would keep root
                os.write(2, f"forge: Landlock failed: {e}\n".encode())
                os._exit(126)

    return apply


_PR_SET_DUMPABLE = 4


def network_namespace(pid: int | str = "self") -> str:
    """The network namespace of a process (Linux: `net:[inode]`), or "" where it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def nondumpable() -> None:
    """Make this process non-dumpable (Linux): its /proc files (environ, mem, maps) then belong to root, so
    a worker of the same user cannot read forge's environment or memory; no core dumps, and a debugger needs
    root to attach. Nothing elsewhere."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def process_uid(pid: int) -> int | None:
    """The real user id of a process, from /proc (Linux); None where it cannot be read."""
    ids = process_uids(pid)
    return ids[0] if ids else None
