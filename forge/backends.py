"""The one table of kernel backends: what each one is written in, built with, exported as and run on.

Everything that differs between backends reads it (kernel files, builds, checks, the launcher, the LLM's
prompts and answers, the review's highlighting, artifacts); a backend is never switched on by its name
elsewhere. `native` backends are C++ or CUDA sources built into a shared library that exports the C entry
point of docs/kernel-abi.md; the others (Triton, Helion) are Python modules imported in the worker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One backend's facts."""

    name: str
    device: str  # the device type its kernels run on ("cpu", "cuda")
    native: bool  # a shared library built by a compiler (else a Python module)
    compiler: str  # the compiler's program ("" for Python); $CXX overrides the C++ one
    suffix: str  # of the source file a build writes
    reads: tuple[str, ...]  # file suffixes that mean this backend when a kernel file is given
    entry: str  # the function the harness calls
    artifact: str  # the built file's name in its build folder
    lexer: str  # Pygments' name for the source language (the review's highlighting)
    fences: tuple[str, ...]  # languages an LLM's fenced answer may name for it
    prompt_lang: str  # the fence language the prompts ask for
    comment: str  # line comment
    example: str  # the short example kernel of the ABI the prompts show (a file in prompts/examples/)
    modules: tuple[str, ...] = ()  # a Python backend's module may import these, and nothing else
    fast_math: tuple[str, ...] = ()  # compiler flags of a kernel built with fast math (the recipes' knob)
    exact_math: tuple[str, ...] = ()  # and without it
    kernels: tuple[str, ...] = ()  # a Python backend's decorators that make a function device code (a kernel)
    calls: tuple[str, ...] = ()  # what its module may call outside kernels besides forge's plain builtins
    warm: bool = False  # its first call on new shapes compiles through PyTorch (Helion traces with fake tensors):
    # the worker makes that call on scratch tensors, unguarded, before any judged call (forge.evaluate.launch)
    autotunes: bool = False  # its kernels name a config its own autotuner can choose (forge.evaluate.autotune)

    @property
    def source_suffix(self) -> str:
        """The suffix of the kernel source bundled with an artifact."""
        return ".src" + self.suffix


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("cpu", "cpu", True, "g++", ".cpp", (".c", ".cc", ".cpp"), "forge_launch", "kernel.so", "cpp",
            ("c", "cpp", "c++", "cc", "cxx", "h", "hpp"), "cpp", "//", "cpu.cpp",
            fast_math=("-ffast-math",), exact_math=("-fno-math-errno",)),  # errno blocks vector sqrt/log
    Backend("cuda", "cuda", True, "nvcc", ".cu", (".cu",), "forge_launch", "kernel.so", "cuda",
            ("cu", "cuda", "c++", "cpp", "c"), "cuda", "//", "cuda.cu",
            fast_math=("--use_fast_math",)),
    Backend("triton", "cuda", False, "", ".py", (".py",), "launch", "kernel.py", "python", ("python", "py"),
            "python", "#", "triton.py", ("triton", "triton.language", "math"),
            kernels=("triton.jit", "jit", "triton.autotune", "triton.heuristics"),
            calls=("triton.cdiv", "triton.next_power_of_2", "triton.Config", "triton.jit", "triton.autotune",
                   "triton.heuristics", "math.ceil", "math.sqrt", "math.log2", "math.prod")),
    # a .py file means Triton; a Helion file is named with --backend helion
    Backend("helion", "cuda", False, "", ".py", (), "launch", "kernel.py", "python", ("python", "py"),
            "python", "#", "helion.py", ("helion", "helion.language", "torch"),
            kernels=("helion.kernel",), calls=("helion.kernel", "helion.Config"), warm=True,
            autotunes=True),
)}
CPU, CUDA, TRITON, HELION = BACKENDS["cpu"], BACKENDS["cuda"], BACKENDS["triton"], BACKENDS["helion"]
NAMES = tuple(BACKENDS)


def backend(name: str) -> Backend:
    """The backend called `name`; ValueError naming the ones there are."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"Invalid backend: {name!r} (use one of {', '.join(NAMES)})") from None


def of_file(suffix: str) -> Backend | None:
    """The backend a kernel file's suffix means, or None."""
    return next((b for b in BACKENDS.values() if suffix in b.reads), None)


def for_device(device: str) -> Backend:
    """The native backend of a device ("cpu", "cuda" or "cuda:N")."""
    return CUDA if device.startswith("cuda") else CPU
