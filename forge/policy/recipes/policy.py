"""The offline recipe policy (the default): its payloads are schedule knobs of forge's code generators
(forge.policy.recipes): the root gets a few diverse schedules, a node gets its one-knob mutations. For tasks no
recipe can express (matmul, convolution, gathers) it says "not mine": no proposals.

A scan task (the gated delta rule's chunk loop, forge.capture.scans) has a lowering of its own: on the CPU the
whole chunk loop as one C kernel (forge.policy.recipes.scan), on a GPU the rule's recurrent form in Triton
(forge.policy.recipes.triton_scan). That one is the scan's only GPU lowering, so it is proposed whenever triton is
installed, `--policy recipes` included: without it the task stays with the library's ATen loop.

On a GPU a task has up to three lowerings, CUDA C++, Triton (forge.policy.recipes.triton_kernels) and Helion
(forge.policy.recipes.helion_kernels), each with its own knobs: the root gets seeds of each asked for, so the search
chooses the backend at the first level of the tree and tunes within it below (a mutation keeps its parent's
backend). Helion's knobs are what its autotuner does not explore (one or two passes, float64 statistics) and its
config, which the search tunes in place of the autotuner (forge.policy.recipes.helion_kernels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import logging
from dataclasses import dataclass
from typing import Any

from forge.kernel import Candidate, Feedback, TaskSpec
from forge.policy.base import Policy
from forge.policy.recipes import cuda, helion_kernels, pointwise, rowreduce, scan, triton_kernels, triton_scan
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.helion_common import HelionKnobs, HelionRowKnobs
from forge.policy.recipes.triton_common import WHOLE_ROW_MAX, TritonKnobs, TritonRowKnobs

log = logging.getLogger(__name__)


# Values each knob may take; the first is the default.
_SPACES: dict[type, dict[str, tuple[Any, ...]]] = {
    pointwise.Knobs: {"chunk": (0, 4096, 65536), "simd": (True, False), "unroll": (1, 4, 16),
                      "fast_math": (False, True)},
    cuda.CudaKnobs: {"threads": (256, 128, 512), "vec": (8, 4, 16), "blocks": (0, 1056, 4224),
                     "fast_math": (False, True)},
    cuda.CudaRowKnobs: {"threads": (256, 128, 512, 1024), "cluster": (1, 2, 4, 8, 16), "vec": (8, 4),
                        "cache": (True, False), "fast_math": (False, True), "warp_rows": (False, True),
                        "smem": (False, True)},
    rowreduce.RowKnobs: {"online": (True, False), "welford": (False, True), "simd": (True, False),
                         "chunk": (0, 1, 8), "fast_math": (False, True)},
    TritonKnobs: {"block": (1024, 512, 2048, 4096), "warps": (4, 2, 8)},
    TritonRowKnobs: {"chunk": (0, 1024, 2048, 4096, 8192), "warps": (4, 8, 16, 2, 1)},
    scan.ScanKnobs: {"parallel": (True, False), "simd": (True, False), "fast_math": (False, True)},
    triton_scan.TritonScanKnobs: {"block_v": (32, 8, 16, 64), "warps": (4, 1, 2, 8), "prefetch": (False, True)},
    HelionKnobs: {"block": (1024, 512, 2048, 4096), "warps": (4, 2, 8), "stages": (1, 2, 3)},
    HelionRowKnobs: {"passes": (1, 2), "acc64": (False, True), "rows": (1, 2, 4), "chunk": (1024, 2048, 4096, 8192),
                     "warps": (4, 8, 16, 2, 1), "stages": (1, 2)},
}
_TRITON = (TritonKnobs, TritonRowKnobs)
_HELION = (HelionKnobs, HelionRowKnobs)


@dataclass
class _Lowered:
    kind: str  # "pointwise" | "rows" | "scan"
    low: Any


class RecipePolicy(Policy):
    """Offline code generation from the task's graph, exploring the generator's schedule knobs."""

    name = "recipes"

    def __init__(self, device: str = "cpu", sms: int | None = None, triton: bool = False, helion: bool = False) -> None:
        """`sms`: the GPU's multiprocessor count the row schedules fill (default: the device's, asked of
        torch; an H200's 132 where no GPU is visible, as when CUDA candidates are rendered on a CPU host).
        `triton`: also propose Triton kernels on a GPU, when triton is installed (never on a CPU; forge optimize
        asks for them with `--policy recipes+triton`; not the default until measured on a GPU). `helion`: also
        Helion kernels, when helion is installed (`--policy recipes+helion`; the same caveat)."""
        self.device = device
        self.sms = sms or _sm_count(device)
        self.triton = triton and self.gpu and importlib.util.find_spec("triton") is not None
        self.helion = helion and self.gpu and importlib.util.find_spec("helion") is not None
        self.autotunes = self.helion
        # what a run stores, and --resume rebuilds
        self.name = "+".join(["recipes"] + ["triton"] * self.triton + ["helion"] * self.helion)
        self._lowered: dict[str, _Lowered | NotMine] = {}
        self._proposed: dict[str, set[Any]] = {}
        self._sources: dict[tuple[str, Any], Candidate | None] = {}
        self._codes: dict[str, set[str]] = {}  # per task: the kernels proposed, by code (knob comment aside)

    def lowered(self, spec: TaskSpec) -> _Lowered:
        """The task lowered by the first recipe that takes it; raises NotMine with every reason."""
        if spec.key not in self._lowered:
            reasons = []
            for kind, mod in (("pointwise", pointwise), ("rows", rowreduce), ("scan", scan)):
                try:
                    if kind == "scan" and self.gpu and importlib.util.find_spec("triton") is None:
                        raise NotMine("the scan recipe on a GPU is Triton, which is not installed")
                    self._lowered[spec.key] = _Lowered(kind, mod.lower(spec))
                    break
                except NotMine as e:
                    reasons.append(f"{kind}: {e}")
            else:
                self._lowered[spec.key] = NotMine("; ".join(reasons))
        got = self._lowered[spec.key]
        if isinstance(got, NotMine):
            raise got
        return got

    @property
    def gpu(self) -> bool:
        """True when the policy writes CUDA (device cuda[:N])."""
        return self.device.startswith("cuda")

    def knob_class(self, spec: TaskSpec) -> type:
        """The knobs dataclass of the task's native recipe on this device (C on a CPU, CUDA on a GPU)."""
        kind = self.lowered(spec).kind
        if kind == "scan":
            return triton_scan.TritonScanKnobs if self.gpu else scan.ScanKnobs
        if self.gpu:
            return cuda.CudaKnobs if kind == "pointwise" else cuda.CudaRowKnobs
        return pointwise.Knobs if kind == "pointwise" else rowreduce.RowKnobs

    def knob_classes(self, spec: TaskSpec) -> tuple[type, ...]:
        """The knobs dataclasses of every lowering of the task on this device: the native one, then Triton's and
        Helion's where asked for; a scan has one (C on the CPU, Triton on a GPU)."""
        kind = self.lowered(spec).kind
        if kind == "scan":
            return (self.knob_class(spec),)
        rows = kind != "pointwise"
        return ((self.knob_class(spec),) + (((TritonRowKnobs if rows else TritonKnobs),) if self.triton else ())
                + (((HelionRowKnobs if rows else HelionKnobs),) if self.helion else ()))

    def refusal(self, spec: TaskSpec) -> str | None:
        """None if a recipe can express the task, else why not."""
        try:
            self.lowered(spec)
        except NotMine as e:
            return str(e)
        return None

    def propose(self, spec: TaskSpec, parent: Any, feedback: Feedback | None = None) -> list[Any]:
        """Root: the default schedule and a few diverse ones; a node: its one-knob mutations."""
        if self.refusal(spec) is not None:
            return []
        seen = self._proposed.setdefault(spec.key, set())
        if parent is None:
            ideas = [idea for cls in self.knob_classes(spec) for idea in self._seeds(spec, cls)]
        else:
            cls = type(parent)
            space = _relevant(_SPACES[cls], cls, self.lowered(spec))
            ideas = [dataclasses.replace(parent, **{k: v}) for k, vals in space.items() for v in vals
                     if getattr(parent, k) != v]
        codes = self._codes.setdefault(spec.key, set())
        fresh = []
        for idea in dict.fromkeys(ideas):
            if idea in seen:
                continue
            seen.add(idea)
            cand = self._render(spec, idea)
            if cand is None:  # a combination the generator refuses
                continue
            code = _code_key(cand)
            if code in codes:  # knobs that do not change this task's kernel: the same code, timed already
                continue
            codes.add(code)
            fresh.append(idea)
        return fresh

    def _seeds(self, spec: TaskSpec, cls: type) -> list[Any]:
        """The root's schedules of one lowering."""
        low = self.lowered(spec).low
        if cls is cuda.CudaRowKnobs:
            return _row_seeds(low, self.sms)
        if cls is TritonKnobs:
            return [TritonKnobs(), TritonKnobs(4096, 8)]
        if cls is TritonRowKnobs:
            return _triton_row_seeds(low.length)
        if cls is triton_scan.TritonScanKnobs:
            return triton_scan.seeds(low)
        if cls is HelionKnobs:
            return [HelionKnobs(), HelionKnobs(4096, 8)]
        if cls is HelionRowKnobs:
            return _helion_row_seeds(low.length)
        space = _relevant(_SPACES[cls], cls, self.lowered(spec))
        combos = list(itertools.product(*space.values()))
        picks = [combos[0]] + combos[1::max(1, len(combos) // 5)]
        return [cls(**dict(zip(space, c, strict=True))) for c in picks]

    def payload_of(self, spec: TaskSpec, knobs: dict[str, Any]) -> Any:
        """The knobs dataclass of stored knobs (the inverse of storing it): how --resume rebuilds a tree. The
        lowering is the one whose knobs have these names."""
        for cls in (self.knob_class(spec), *_TRITON, *_HELION):
            if set(knobs) == {f.name for f in dataclasses.fields(cls)}:
                return cls(**knobs)
        return self.knob_class(spec)(**knobs)  # the native class's own error names what is wrong

    def _render(self, spec: TaskSpec, knobs: Any) -> Candidate | None:
        """The candidate for these knobs, rendered once (None: a combination the generator refuses)."""
        key = (spec.key, knobs)
        if key not in self._sources:
            low = self.lowered(spec)
            try:
                if isinstance(knobs, _TRITON):
                    self._sources[key] = triton_kernels.candidate(spec, knobs, low.low)
                elif isinstance(knobs, triton_scan.TritonScanKnobs):
                    self._sources[key] = triton_scan.candidate(spec, low.low, knobs)
                elif isinstance(knobs, _HELION):
                    self._sources[key] = helion_kernels.candidate(spec, knobs, low.low)
                elif self.gpu:
                    self._sources[key] = cuda.candidate(spec, knobs, low.low)
                elif low.kind == "scan":
                    self._sources[key] = scan.candidate(low.low, knobs)
                elif low.kind == "pointwise":
                    self._sources[key] = pointwise.candidate(low.low, knobs)
                else:
                    self._sources[key] = rowreduce.candidate(low.low, knobs)
            except NotMine as e:
                log.debug("no kernel for %s: %s", knobs, e)
                self._sources[key] = None
        return self._sources[key]

    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """The C (cpu), CUDA or Triton source for these knobs."""
        cand = self._render(spec, payload)
        if cand is None:
            lang = "Triton" if isinstance(payload, (*_TRITON, triton_scan.TritonScanKnobs)) else \
                "Helion" if isinstance(payload, _HELION) else \
                "CUDA" if self.gpu else "C"
            raise NotMine(f"no {lang} kernel for {payload}")
        return cand


def _code_key(cand: Candidate) -> str:
    """The candidate's code and flags without the generator's comment (which names the knobs)."""
    body = "\n".join(line for line in cand.source.splitlines()
                     if not line.startswith(("// forge recipe", "# forge recipe")))
    return hashlib.sha256((body + "\0" + " ".join(cand.flags)).encode()).hexdigest()


def _relevant(space: dict[str, tuple[Any, ...]], cls: type, low: _Lowered) -> dict[str, tuple[Any, ...]]:
    """The knobs that change the kernel of this op: mutating the others would only re-time the same code."""
    if cls is not rowreduce.RowKnobs:
        return space
    softmax = low.low.op in ("_softmax", "_log_softmax", "logsumexp")
    variance = low.low.op in ("native_layer_norm", "native_group_norm", "var")
    drop = {"welford"} if softmax else {"online"} if variance else {"online", "welford"}
    return {k: v for k, v in space.items() if k not in drop}


def _sm_count(device: str) -> int:
    """The multiprocessor count of a CUDA device, or 132 (an H200's) when none is visible here."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def _row_seeds(low: rowreduce.RowLowered, sms: int) -> list[cuda.CudaRowKnobs]:
    """First CUDA row schedules: enough blocks to fill the GPU, each thread's part of the row in registers
    (at most 32 elements), few idle threads; then the same without the register cache."""
    scored = []
    for threads, cluster in itertools.product((128, 256, 512, 1024), (1, 2, 4, 8)):
        if low.length % cluster:
            continue
        chunk = low.length // cluster
        per_thread = -(-chunk // threads)
        idle = threads * max(per_thread, 1) / chunk - 1  # threads without work, as a fraction
        fills = low.rows * cluster >= sms
        if per_thread > 32 or (cluster > 1 and low.rows >= 2 * sms):
            continue
        scored.append(((not fills, idle > 0.25, cluster, abs(per_thread - 8)), cuda.CudaRowKnobs(threads, cluster)))
    seeds = [k for _, k in sorted(scored, key=lambda x: x[0])[:4]]
    if low.length <= 32 * 64:  # short rows: a warp each, the row in its registers
        seeds += [cuda.CudaRowKnobs(256, warp_rows=True), cuda.CudaRowKnobs(128, warp_rows=True, vec=4)]
    if low.rows < sms:  # few long rows: a cluster per row, its part of the row in shared memory
        seeds += [cuda.CudaRowKnobs(t, c, smem=True, fast_math=True) for t, c in ((256, 8), (256, 16), (512, 16))]
    # and one that always applies: the row re-read from memory (L2) instead of kept on chip
    cluster = next(c for c in (16, 8, 4, 2, 1) if low.length % c == 0) if low.rows < sms else 1
    return seeds + [cuda.CudaRowKnobs(threads=512 if cluster > 1 else 256, cluster=cluster, cache=False,
                                      fast_math=True)]


def _triton_row_seeds(length: int) -> list[TritonRowKnobs]:
    """First Triton row schedules: the whole row in one block where it fits (more warps for longer rows), and
    the row walked in chunks."""
    block = 1 << max(length - 1, 1).bit_length()
    seeds = [TritonRowKnobs(0, 4 if block <= 2048 else 8 if block <= 8192 else 16)] if block <= WHOLE_ROW_MAX else []
    return seeds + [TritonRowKnobs(min(4096, max(block // 2, 1024)), 8)]


def _helion_row_seeds(length: int) -> list[HelionRowKnobs]:
    """First Helion row schedules: the row held whole where it fits (more warps for longer rows), and walked in
    chunks."""
    block = 1 << max(length - 1, 1).bit_length()
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    whole = [HelionRowKnobs(passes=1, warps=warps)] if block <= WHOLE_ROW_MAX else []
    return whole + [HelionRowKnobs(passes=2, chunk=min(4096, max(block // 2, 1024)), warps=8)]
