"""Checks on a built CPU library, where source tricks cannot hide (issue 13: token pasting, `std :: thread`,
function pointers to `system`, hand-declared calls, constructors behind macros).

- Every dynamic symbol the library imports must be on ALLOWED_IMPORTS (math, memory copies, OpenMP, the
  C runtime's own start-up and stack-protector symbols); anything else is a finding, its status by what
  it reaches (threads, allocation, timers, code at exit, else files/processes/network).
- No constructor or destructor beyond the compiler's own (one entry each in `.init_array` / `.fini_array`),
  no `.ctors` / `.dtors`.
- No raw system-call instruction (`syscall`, `sysenter`, `int $0x80`; `svc` on ARM) in its code.

Read with binutils (`readelf`, `objdump`), which a C++ compiler always comes with. CUDA libraries link the
CUDA runtime statically, whose own imports (dlopen, threads) would drown a kernel's: not checked here yet.
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
_SYSCALL = {"x86_64": re.compile(r"\t(syscall|sysenter|int\s+\$0x80)\b"), "aarch64": re.compile(r"\tsvc\b")}


def check_library(path: str | Path, backend: str) -> list[Finding]:
    """Every rule the built library breaks (see the module doc); empty when it may be loaded."""
    if BACKENDS[backend].compiler != "g++" or shutil.which("readelf") is None:
        return []
    syms = imports(path)
    if syms is None:
        return [(Status.FORBIDDEN_CODE, "its dynamic symbols cannot be read (readelf failed): not loaded")]
    found = [f for f in (_import_finding(sym) for sym in sorted(syms)) if f is not None]
    sizes = _section_sizes(path)
    for name, kind in ((".init_array", "constructor"), (".fini_array", "destructor")):
        if sizes.get(name, 0) > 8:
            found.append((Status.FORBIDDEN_CODE, f"has a {kind} of its own ({name} holds "
                          f"{sizes[name] // 8} entries, the compiler's own is 1): code that runs at load"))
    for name in (".ctors", ".dtors"):
        if sizes.get(name, 0) > 16:
            found.append((Status.FORBIDDEN_CODE, f"has {name} entries: code that runs at load or exit"))
    if (insn := _raw_syscall(path)) is not None:
        found.append((Status.FORBIDDEN_IO, f"makes a raw system call (`{insn}` instruction)"))
    return found


def imports(path: str | Path) -> set[str] | None:
    """The undefined dynamic symbols of a shared library (version suffixes dropped); None if unreadable."""
    out = _run(["readelf", "--dyn-syms", "-W", str(path)])
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
