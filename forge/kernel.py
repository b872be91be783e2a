"""Kernel candidates and their formats (the ABI), and the statuses an evaluation can end with.

Backends (docs/kernel-abi.md has the full contract and examples):
- `cpu`: C/C++ exporting `extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out,
  int n_out)`, built with the system compiler (-O3 -march=native -fopenmp) into a shared library;
- `cuda`: CUDA C++ exporting the same launcher with a trailing `cudaStream_t stream`, built with
  `nvcc -shared` for the device's architecture;
- `triton`: Python defining `@triton.jit` kernels and `launch(inputs, outputs)` over torch tensors.
The harness allocates every output; a candidate only writes into it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from forge.backends import BACKENDS, of_file
from forge.backends import backend as _backend
from forge.capture.export import TensorMeta

ABI_DIR = Path(__file__).resolve().parent / "abi"
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4, "int32": 5, "int8": 6,
               "uint8": 7, "bool": 8}


class Status(str, Enum):
    """How an evaluation ended. Only OK passes; each kind of rejection has its own status."""

    OK = "ok"
    # Static checks (forge.evaluate.checks), before building:
    FORBIDDEN_TORCH = "forbidden_torch"  # calls into PyTorch/ATen compute
    FORBIDDEN_ALLOC = "forbidden_alloc"  # allocates memory (the harness allocates every output)
    FORBIDDEN_CONCURRENCY = "forbidden_concurrency"  # other streams or threads
    FORBIDDEN_IO = "forbidden_io"  # files, environment, network, processes
    FORBIDDEN_TIMER = "forbidden_timer"  # timer tampering
    FORBIDDEN_CODE = "forbidden_code"  # code at load, inline assembly, Python outside the rules
    BAD_FORMAT = "bad_format"  # no launcher, does not parse
    # A policy that wrote no kernel (forge.kernel.NoKernel: an LLM node):
    PROVIDER_ERROR = "provider_error"  # the provider failed: HTTP errors, timeouts, no answer by the deadline
    TRUNCATED = "truncated"  # the answer was cut (max_tokens, or forge's size cap) before it held usable code
    REFUSED = "refused"  # the model refused, or answered nothing
    NOT_ASKED = "not_asked"  # the request was never sent: budget, deadline, a replay without its answer
    # Building and running:
    BUILD_ERROR = "build_error"
    LAUNCH_ERROR = "launch_error"  # missing entry point, non-zero return, Python exception in a launcher
    CRASH = "crash"  # the worker died: segfault, abort, illegal address
    TIMEOUT = "timeout"  # a hang or an infinite loop
    OUT_OF_MEMORY = "out_of_memory"
    # Verification (forge.evaluate.verify):
    OUT_OF_BOUNDS = "out_of_bounds"  # wrote into the guard zone around an output
    INPUT_MUTATED = "input_mutated"
    PARTIAL_WRITE = "partial_write"  # some output element was left as the NaN poison
    NONFINITE = "nonfinite"  # NaN or Inf where the reference has none
    STALE_RESULT = "stale_result"  # the same output for different inputs (a cached result)
    CONSTANT_OUTPUT = "constant_output"
    LOW_PRECISION = "low_precision"  # error above tolerance, in the range of a lower precision
    WRONG_RESULT = "wrong_result"
    REFERENCE_ERROR = "reference_error"  # the reference itself failed on the generated inputs
    # Benchmarking (forge.bench):
    TOO_FAST = "too_fast"  # faster than the roofline floor allows: not doing the work
    # The search (forge.search.driver):
    DUPLICATE = "duplicate"  # the same source as an earlier node of the task (comments, spacing aside): not evaluated

    @property
    def passed(self) -> bool:
        """True only for OK."""
        return self is Status.OK


@dataclass(frozen=True)
class Candidate:
    """A kernel for a task: source text in one backend's format."""

    backend: str
    source: str
    entry: str = ""  # default: the backend's (forge_launch / launch)
    flags: tuple[str, ...] = ()  # extra compiler flags (cpu, cuda)
    llm_calls: tuple[int, ...] = field(default=(), compare=False)  # the stored LLM calls it came from

    def __post_init__(self) -> None:
        b = _backend(self.backend)  # ValueError for an unknown one
        if not self.entry:
            object.__setattr__(self, "entry", b.entry)

    @classmethod
    def from_file(cls, path: str | Path, backend: str | None = None) -> Candidate:
        """A candidate from a file; the backend follows the suffix (.c/.cpp cpu, .cu cuda, .py triton)."""
        path = Path(path)
        known = of_file(path.suffix)
        name = backend or (known.name if known else None)
        if name is None:
            reads = ", ".join(f"{'/'.join(b.reads)} {b.name}" for b in BACKENDS.values())
            raise ValueError(f"Invalid kernel file {path}: cannot tell the backend from {path.suffix!r} ({reads})")
        return cls(name, path.read_text())

    @property
    def digest(self) -> str:
        """Content hash of the candidate (source, entry, flags)."""
        h = hashlib.sha256(f"{self.backend}\0{self.entry}\0{' '.join(self.flags)}\0".encode())
        h.update(self.source.encode())
        return h.hexdigest()[:16]

    @property
    def normal_digest(self) -> str:
        """Content hash with comments and whitespace left out: two candidates with the same one are the same
        kernel (the search evaluates it once)."""
        h = hashlib.sha256(f"{self.backend}\0{self.entry}\0{' '.join(self.flags)}\0".encode())
        h.update(normal_form(self.source, _backend(self.backend).comment).encode())
        return h.hexdigest()[:16]


# a C/C++/CUDA string or character literal (kept as written), or a comment (left out)
_C_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def normal_form(source: str, comment: str) -> str:
    """A source without comments (`comment`: the line comment, "//" for C/C++/CUDA with their block comments,
    "#" for Python) and with its spacing normalised but its lines kept: two sources with the same normal form
    are the same program. In C, runs of spaces within a line become one and a line's indentation goes (a
    newline ends a preprocessor directive, so lines stay lines); in Python, the tokens of each logical line are
    respaced, blank lines and comments go, and the indentation stays. String literals are kept as written."""
    return _python_form(source) if comment == "#" else _c_form(source)


def _c_form(source: str) -> str:
    literals: list[str] = []

    def keep(m: re.Match[str]) -> str:  # a literal is set aside; a comment is one space, even across lines
        if m[0][0] in "\"'":
            literals.append(m[0])
            return f"\0{len(literals) - 1}\0"
        return " "

    lines = (" ".join(line.split()) for line in _C_TOKEN.sub(keep, source).splitlines())
    return re.sub(r"\0(\d+)\0", lambda m: literals[int(m[1])], "\n".join(line for line in lines if line))


def _python_form(source: str) -> str:
    import io
    import tokenize

    try:
        tokens = [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.NL)]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, SyntaxError):  # not Python: lines without trailing comments or spacing
        lines = []
        for line in source.splitlines():
            if "'" not in line and '"' not in line:
                line = line.split("#", 1)[0]
            body = line.lstrip()
            if body:
                lines.append(line[:len(line) - len(body)] + " ".join(body.split()))
        return "\n".join(lines)


@dataclass(frozen=True)
class Feedback:
    """What the search tells a policy about the node it expands: that node's own evaluation (no status at the
    root, the eager baseline) and the task's statistics so far (read-only: the search keeps them)."""

    status: str | None = None  # the node's Status value; None: the root
    message: str = ""  # why it failed, or what the judge noted
    speedup: float | None = None  # the node's, over eager
    median_us: float | None = None  # the node's time
    error: float | None = None  # the node's largest relative error over the input sets, when it was verified
    best_us: float | None = None  # the task's best time so far
    eager_us: float | None = None  # the task's eager time (the median of its paired measurements)
    floor_us: float | None = None  # the task's memory-traffic floor
    tried: int = 0  # candidates evaluated for the task
    best: Candidate | None = None  # the task's fastest passing candidate so far


@dataclass(frozen=True)
class NoKernel(Candidate):
    """A node the policy could not write (refusal, empty or malformed answer, spent budget): fails unbuilt.

    Its source is a comment with the reason, so the tree shows why; the evaluator answers `status`.
    """

    reason: str = ""
    status: Status = Status.BAD_FORMAT

    @classmethod
    def because(cls, backend: str, reason: str, status: Status = Status.BAD_FORMAT) -> NoKernel:
        """A failed node of the backend with this reason (and status: what kept the kernel from being written)."""
        comment = _backend(backend).comment
        return cls(backend, f"{comment} forge: no kernel: " + reason.replace("\n", " ") + "\n", reason=reason,
                   status=status)


@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs of a task: the reference source and the tensor metadata. No tensors."""

    key: str
    source: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    floor_bytes: int = 0  # bytes the task must move at least (roofline floor)
    module: str = ""  # the user's module it came from, "path (Class)" (forge.tasks.origin)
    module_source: str = ""  # that module's forward source (what a prompt shows)
    eager_us: float | None = None  # one occurrence's time in the profile
    share: float | None = None  # of the model's time

    @classmethod
    def of(cls, task: Any) -> TaskSpec:
        """The spec of a forge.tasks.cut.Task."""
        eager = task.ms * 1e3 / max(task.count, 1) if getattr(task, "ms", None) else None
        return cls(task.key, task.source, task.inputs, task.outputs, task.bytes, getattr(task, "module", ""),
                   getattr(task, "module_source", ""), eager, getattr(task, "share", None))


@dataclass(frozen=True)
class Timing:
    """Benchmark statistics in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    std_us: float
    n: int
    ci_lo_us: float | None = None  # the 95% interval of the median (forge.confidence.median_ci)
    ci_hi_us: float | None = None


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one candidate: status, message, logs, verification detail, timings."""

    status: Status
    message: str = ""
    build_log: str = ""
    build_s: float = 0.0
    verify: dict[str, Any] = field(default_factory=dict)
    timing: Timing | None = None
    baseline: Timing | None = None
    floor_us: float | None = None
    device: str = ""
    device_s: float = 0.0

    @property
    def speedup(self) -> float | None:
        """Baseline median over candidate median, when both were measured."""
        from forge.confidence import speedup

        return speedup(self.baseline, self.timing)


@dataclass(frozen=True)
class KernelArtifact:
    """A verified kernel for one task: its built library (or module) and how to call it."""

    key: str
    backend: str  # a name in forge.backends.BACKENDS
    path: str
    entry: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    source: str  # the task's reference source (informative: the fallback is rendered from the model applied to)
    kernel_source: str = ""  # the kernel's own source, bundled with an artifact for review
