"""Facts a prompt states about the machine and the build: the device, and the compiler's report on a kernel.

The CPU facts come from where the kernel will run: the worker's OpenMP thread count (OMP_NUM_THREADS, else
the CPUs this process may run on, which the worker inherits), each cache level with how many CPUs share it
(an L3 is per socket or per CCX, not per core), and the SIMD extensions the first CPU's flags list,
AVX-512 sub-features included.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Any

_SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
         "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16",
         "avx512_bitalg", "avx512_vpopcntdq", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
         "asimd", "asimdhp", "sve", "sve2", "i8mm", "bf16")
_REPORT = re.compile(r"kernel\.\w+:(\d+):\d+: (optimized|missed|remark): (.*)")
# ptxas -v: the entry compiled, its registers and shared memory, and (on a line of its own since CUDA 12) its
# stack frame and spills
_PTXAS = re.compile(r"ptxas info\s*: (Used .*|Compiling entry function .*|.*bytes stack frame.*)|"
                    r"^\s+(\d+ bytes stack frame, .*)")


def openmp_threads() -> int:
    """The threads an OpenMP kernel gets in a worker: OMP_NUM_THREADS (its first level), else this process's CPUs."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
            elif not line.strip() and model and flags:
                break
    except OSError:
        pass
    return model, flags


def _caches() -> list[str]:
    """Data and unified caches of CPU 0, each with the CPUs that share it."""
    out = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in sorted(base.glob("index*")):
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level, size = (idx / "level").read_text().strip(), (idx / "size").read_text().strip()
            shared = _count((idx / "shared_cpu_list").read_text().strip())
            out.append(f"L{level} {size} " + ("per core" if shared <= 1 else f"shared by {shared} CPUs"))
    except OSError:
        pass
    return out


def _count(cpu_list: str) -> int:
    n = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def cpu_facts() -> str:
    """CPU model, the CPUs and OpenMP threads a kernel gets, caches, SIMD."""
    model, flags = _cpuinfo()
    simd = [f for f in _SIMD if f in flags]
    caches = _caches()
    return (f"CPU: {model or 'unknown model'}; {os.cpu_count()} logical CPUs, OpenMP runs {openmp_threads()} "
            "threads in the worker" + (f"; caches: {', '.join(caches)}" if caches else "")
            + (f"; SIMD: {', '.join(simd)}" if simd else "")
            + ("" if "avx512f" not in flags else "; -march=native enables the AVX-512 features listed"))


def cuda_facts(device: str) -> str:
    """The facts of the GPU `device` names (gpu_facts), or a line saying none is visible to this process."""
    import torch

    if not torch.cuda.is_available():
        return f"GPU: {device}, not visible to this process (its facts are unknown here)"
    return gpu_facts(torch.cuda.get_device_properties(device))


def gpu_facts(p: Any) -> str:
    """A GPU as a prompt states it, from torch's device properties: name and architecture, SMs and their clock,
    the L2, shared memory per block (opt-in) and per SM, registers per SM, warp size and thread limits, memory
    and its peak bandwidth (memory clock x bus width x 2, double data rate). Properties torch does not report
    are left out."""
    facts = [f"GPU: {p.name} (sm_{p.major}{p.minor}), {p.multi_processor_count} SMs"
             + (f" at up to {p.clock_rate / 1e6:.2f} GHz" if getattr(p, "clock_rate", 0) else ""),
             f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB"]
    optin, per_sm = getattr(p, "shared_memory_per_block_optin", 0), getattr(p, "shared_memory_per_multiprocessor", 0)
    if optin:
        facts.append(f"shared memory up to {optin // 1024} KiB per block (over 48 KiB by opt-in: "
                     "cudaFuncSetAttribute MaxDynamicSharedMemorySize)")
    if per_sm:
        facts.append(f"{per_sm // 1024} KiB of shared memory per SM")
    if getattr(p, "regs_per_multiprocessor", 0):
        facts.append(f"{p.regs_per_multiprocessor} 32-bit registers per SM")
    if getattr(p, "max_threads_per_block", 0):
        facts.append(f"warps of {getattr(p, 'warp_size', 32)} threads, at most {p.max_threads_per_block} threads "
                     f"per block and {getattr(p, 'max_threads_per_multi_processor', 0)} per SM")
    facts.append(f"{p.total_memory / 2**30:.0f} GiB memory")
    clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    if clock and bus:  # kHz x bits
        facts[-1] += f" at a peak of {clock * 1e3 * 2 * bus / 8 / 1e12:.1f} TB/s"
    return ", ".join(facts)


@cache
def device_facts(device: str) -> str:
    """SMs, caches, shared memory (CUDA) or CPUs, threads, caches and SIMD (CPU), as one line."""
    return cuda_facts(device) if device.startswith("cuda") else cpu_facts()


def compiler_report(build_log: str, limit: int = 24) -> str:
    """The vectoriser's remarks on the kernel's own lines (GCC -fopt-info, Clang -Rpass) and ptxas's register,
    shared-memory and spill lines, deduplicated, at most `limit` lines; "" when the log has none."""
    seen: list[str] = []
    for line in build_log.splitlines():
        m = _REPORT.search(line)
        ptxas = None if m else _PTXAS.search(line)
        text = f"line {m[1]}: {m[2]}: {m[3].strip()}" if m else (ptxas[1] or ptxas[2]).strip() if ptxas else None
        if text and text not in seen:
            seen.append(text)
    return "\n".join(seen[:limit]) + (f"\n... ({len(seen) - limit} more)" if len(seen) > limit else "")


def without_report(build_log: str) -> str:
    """A build log without the vectoriser's remarks and ptxas info (what a build error is read in)."""
    keep = [ln for ln in build_log.splitlines()
            if not _REPORT.search(ln) and not _PTXAS.search(ln) and "ptxas info" not in ln
            and not ln.startswith(" scalar_type")]
    return "\n".join(keep)
