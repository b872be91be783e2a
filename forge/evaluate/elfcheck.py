"""Checks on a built CPU library, where source tricks cannot hide (issue 13: token pasting, `std :: thread`,
function pointers to `system`, hand-declared calls, constructors behind macros).

- Every dynamic symbol the library imports must be on ALLOWED_IMPORTS (math, memory copies, OpenMP, the
  C runtime's own start-up and stack-protector symbols); anything else is a finding, its status by what
  it reaches (threads, allocation, timers, code at exit, else files/processes/network).
- No constructor or destructor beyond the compiler's own (one entry each in `.init_array` / `.fini_array`),
  no `.ctors` / `.dtors`.
- No raw system-call instruction (`syscall`, `sysenter`, `int $0x80`; `svc` on ARM) in its code.

CUDA libraries link the CUDA runtime statically, whose own imports (dlopen, sockets, threads) would drown a
kernel's; so a CUDA build keeps its host object (`host.o`, forge.evaluate.build), whose undefined symbols are
exactly what the kernel's own host code calls, and the same rules run on that: the CUDA runtime calls a
launcher needs (registration, launch, errors, attributes, occupancy, copies and sets on its stream) and the
CPU list; anything else by what it reaches (memory, streams and graphs, events, IPC and device state). One
constructor (nvcc's registration) and one `atexit` (its unregistration) are nvcc's own.

Read with binutils (`readelf`, `objdump`), which a C++ compiler always comes with.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

from forge.backends import BACKENDS
from forge.kernel import Status

Finding = tuple[Status, str]

_MATH = (r"(a?(sin|cos|tan)h?|atan2|exp(2|10|m1)?|log(2|10|1p|b)?|ilogb|pow|sqrt|cbrt|hypot|erfc?|[lt]gamma|"
         r"floor|ceil|round|lround|llround|trunc|rint|lrint|llrint|nearbyint|fmod|remainder|remquo|fmin|fmax|"
         r"fdim|fma|fabs|copysign|nan|ldexp|frexp|modf|scalbl?n|sincos|nextafter|isnan|isinf|finite)[fl]?"
         r"(_finite)?")
ALLOWED_IMPORTS = re.compile(
    rf"^(__)?({_MATH}|_ZGV\w+|mem(cpy|move|set|cmp)|__mem(cpy|move|set)_chk|GOMP_\w+|omp_get_\w+|omp_in_parallel|"
    r"__cxa_finalize|__gmon_start__|_ITM_(de)?registerTMCloneTable|__stack_chk_fail|__stack_chk_guard|"
    r"__gxx_personality_v0|_Unwind_Resume|__cxa_guard_(acquire|release|abort)|__cxa_(begin|end)_catch|_ZSt9terminatev|__cxa_pure_virtual|"
    r"__(pop|clz|ctz|parity)count\w*|__(div|mul|mod|udiv|umod)[sdt]i3|__fix\w+|__float\w+|__extend\w+|"
    r"__trunc\w+)$")
_BY_KIND: tuple[tuple[Status, str, str], ...] = (
    (Status.FORBIDDEN_CONCURRENCY, "creates threads or processes",
     r"pthread_|thread|^_ZNSt6|fork|clone|^spawn|^posix_spawn|async"),
    (Status.FORBIDDEN_ALLOC, "allocates memory", r"alloc|^free$|^_Zn[wa]|^_Zd[la]|mmap|sbrk|^brk$|memalign"),
    (Status.FORBIDDEN_TIMER, "reads or sets timers", r"clock|time|sleep|alarm|itimer"),
    (Status.FORBIDDEN_CODE, "runs code at exit", r"atexit|on_exit|^__cxa_thread_atexit"),
    (Status.FORBIDDEN_CODE, "calls into the Python interpreter (it could patch the judge)", r"^_?Py"),
)
HOST_OBJECT = "host.o"  # a CUDA build's host object, next to its library (forge.evaluate.build)
# What a CUDA launcher's host code may call besides the CPU list: nvcc's registration and launch, errors,
# function attributes, occupancy, device attributes, copies and sets (on the given stream or synchronous),
# symbols, the given stream's synchronisation, and atexit (nvcc's unregistration; counted below).
CUDA_IMPORTS = re.compile(
    r"^(__cuda(RegisterFatBinary(End)?|RegisterFunction|RegisterVar|RegisterTexture|RegisterSurface|"
    r"UnregisterFatBinary|PushCallConfiguration|PopCallConfiguration|GetKernel|LaunchKernel(_ptsz)?|InitModule)|"
    r"cuda(GetLastError|PeekAtLastError|GetErrorString|GetErrorName|FuncSetAttribute|FuncGetAttributes|"
    r"FuncSetCacheConfig|FuncSetSharedMemConfig|LaunchKernel(ExC)?(_ptsz)?|LaunchCooperativeKernel(_ptsz)?|"
    r"Occupancy\w+|GetDevice|GetDeviceCount|DeviceGetAttribute|GetDeviceProperties(_v2)?|"
    r"Memcpy(Async|2DAsync|ToSymbolAsync|FromSymbolAsync)?(_ptsz|_ptds)?|Memset(Async|2DAsync)?(_ptsz|_ptds)?|"
    r"GetSymbolAddress|GetSymbolSize|StreamSynchronize(_ptsz)?)|atexit)$")
_CUDA_KINDS: tuple[tuple[Status, str, str], ...] = (
    (Status.FORBIDDEN_ALLOC, "allocates memory", r"^cuda(Malloc|Free|HostAlloc|HostRegister|MemPool|Array)|"
     r"^__cudaRegisterManagedVar|^cuMem"),
    (Status.FORBIDDEN_CONCURRENCY, "makes streams, graphs or host callbacks",
     r"^cuda(Stream|Graph|LaunchHostFunc|ThreadExchange|SetDevice|CtxResetPersisting)"),
    (Status.FORBIDDEN_TIMER, "reads events or the profiler", r"^cuda(Event|Profiler)"),
    (Status.FORBIDDEN_CODE, "reaches past its launch (IPC, driver entry points, device state)", r"^_*cu[A-Z]|^cuda"),
)
_SYSCALL = {"x86_64": re.compile(r"\t(syscall|sysenter|int\s+\$0x80)\b"), "aarch64": re.compile(r"\tsvc\b")}


def check_library(path: str | Path, backend: str) -> list[Finding]:
    """Every rule the built library breaks (see the module doc); empty when it may be loaded. A CUDA library
    is judged by its host object (HOST_OBJECT next to it)."""
    b = BACKENDS[backend]
    if not b.native or shutil.which("readelf") is None:
        return []
    if b.device == "cuda":
        obj = Path(path).with_name(HOST_OBJECT)
        if not obj.exists():
            return [(Status.FORBIDDEN_CODE, "its host object is missing: what its host code calls cannot be read")]
        return check_object(obj)
    syms = imports(path)
    if syms is None:
        return [(Status.FORBIDDEN_CODE, "its dynamic symbols cannot be read (readelf failed): not loaded")]
    found = [f for f in (_import_finding(sym) for sym in sorted(syms)) if f is not None]
    return found + _code_at_load(path) + _raw_syscall_finding(path)


def check_object(path: str | Path) -> list[Finding]:
    """The rules on a CUDA build's host object: its undefined symbols against the CUDA and CPU allowlists,
    one constructor and one atexit call (nvcc's), no raw system call."""
    syms = imports(path, dynamic=False)
    if syms is None:
        return [(Status.FORBIDDEN_CODE, "its symbols cannot be read (readelf failed): not loaded")]
    found = [f for f in (_cuda_finding(sym) for sym in sorted(syms)) if f is not None]
    calls = sum(1 for line in _run(["readelf", "-r", "-W", str(path)]).splitlines() if re.search(r"\batexit\b", line))
    if calls > 1:
        found.append((Status.FORBIDDEN_CODE, f"calls atexit {calls} times (nvcc's unregistration is one): code "
                      "that runs at exit"))
    return found + _code_at_load(path) + _raw_syscall_finding(path)


def _cuda_finding(sym: str) -> Finding | None:
    if CUDA_IMPORTS.match(sym):
        return None
    for status, what, pattern in _CUDA_KINDS:
        if re.search(pattern, sym):
            return status, f"calls `{sym}`: {what}"
    return _import_finding(sym)


def _code_at_load(path: str | Path) -> list[Finding]:
    found = []
    sizes = _section_sizes(path)
    for name, kind in ((".init_array", "constructor"), (".fini_array", "destructor")):
        if sizes.get(name, 0) > 8:
            found.append((Status.FORBIDDEN_CODE, f"has a {kind} of its own ({name} holds "
                          f"{sizes[name] // 8} entries, the compiler's own is 1): code that runs at load"))
    for name in (".ctors", ".dtors"):
        if sizes.get(name, 0) > 16:
            found.append((Status.FORBIDDEN_CODE, f"has {name} entries: code that runs at load or exit"))
    return found


def _raw_syscall_finding(path: str | Path) -> list[Finding]:
    insn = _raw_syscall(path)
    return [] if insn is None else [(Status.FORBIDDEN_IO, f"makes a raw system call (`{insn}` instruction)")]


def imports(path: str | Path, dynamic: bool = True) -> set[str] | None:
    """The undefined dynamic symbols of a shared library (version suffixes dropped), or with `dynamic` False
    the undefined symbols of an object file; None if unreadable."""
    out = _run(["readelf", "--dyn-syms" if dynamic else "--syms", "-W", str(path)])
    if "Symbol table" not in out:
        return None
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[6] == "UND" and parts[7]:
            syms.add(parts[7].split("@")[0])
    return syms


def _import_finding(sym: str) -> Finding | None:
    if ALLOWED_IMPORTS.match(sym):
        return None
    for status, what, pattern in _BY_KIND:
        if re.search(pattern, sym, re.I):
            return status, f"imports `{sym}`: {what}"
    return Status.FORBIDDEN_IO, f"imports `{sym}`, which is not on the allowlist (math, memory copies, OpenMP)"


def _section_sizes(path: str | Path) -> dict[str, int]:
    sizes = {}
    for m in re.finditer(r"\]\s+(\.\S+)\s+\S+\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", _run(["readelf", "-S", "-W",
                                                                                         str(path)])):
        sizes[m[1]] = int(m[2], 16)
    return sizes


def _raw_syscall(path: str | Path) -> str | None:
    pattern = _SYSCALL.get(platform.machine())
    if pattern is None or shutil.which("objdump") is None:
        return None
    m = pattern.search(_run(["objdump", "-d", "--no-show-raw-insn", str(path)]))
    return m[1] if m else None


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
