"""The runtime of a kernel package exported by forge (`forge export RUN --format hf-kernels DIR`).

Copied as it is into every exported package; it needs torch only (and triton for Triton kernels, helion for Helion
ones). Each kernel in kernels.json becomes a torch op `torch.ops.<namespace>.<name>` (a custom op with a fake
implementation, so it is opaque to torch.compile) and a guarded function: the op runs when the inputs are what the
kernel was verified for (device type, dtype, shape and stride of every input, no autograd), the region's reference
otherwise.

Kernels of the `cpu` backend are C shared libraries with forge's C entry point (docs/kernel-abi.md):
`int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out)`, called through ctypes (they
link neither Python nor torch). Kernels of the `triton` and `helion` backends are Python modules with
`launch(inputs, outputs)` (a Helion one with its config in its source: compiled on its first call, not autotuned).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": (torch.float32, 0), "float16": (torch.float16, 1), "bfloat16": (torch.bfloat16, 2),
          "float64": (torch.float64, 3), "int64": (torch.int64, 4), "int32": (torch.int32, 5),
          "int8": (torch.int8, 6), "uint8": (torch.uint8, 7), "bool": (torch.bool, 8)}
_CODES = {dt: code for dt, code in DTYPES.values()}
_PLATFORM = f"{platform.machine()}-{platform.system().lower()}"


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (Linux: /proc/cpuinfo), empty where unknown. A CPU
    kernel is built for the exporting machine's CPU (-march=native): it runs only where the CPU has every flag
    that one had (an instruction it lacks would kill the process with SIGILL), the reference elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


class ForgeTensor(ctypes.Structure):
    """forge_abi.h's ForgeTensor."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("stride", ctypes.POINTER(ctypes.c_int64))]


def _forge_tensors(tensors: list[torch.Tensor], keep: list[Any]) -> ctypes.Array:
    """The tensors as a ForgeTensor array; `keep` holds the shape and stride arrays while the call runs."""
    arr = (ForgeTensor * max(1, len(tensors)))()
    for i, t in enumerate(tensors):
        shape = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
        stride = (ctypes.c_int64 * max(1, t.dim()))(*t.stride())
        keep += [shape, stride]
        arr[i] = ForgeTensor(t.data_ptr(), _CODES[t.dtype], t.dim(), shape, stride)
    return arr


def _native(path: Path, entry: str, cuda: bool) -> Callable[[list[torch.Tensor], list[torch.Tensor]], None]:
    fn = getattr(ctypes.CDLL(str(path)), entry)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ForgeTensor), ctypes.c_int, ctypes.POINTER(ForgeTensor), ctypes.c_int]
    if cuda:  # the CUDA entry point takes the stream last
        fn.argtypes.append(ctypes.c_void_p)

    def launch(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        keep: list[Any] = []
        args = [_forge_tensors(inputs, keep), len(inputs), _forge_tensors(outputs, keep), len(outputs)]
        if cuda:  # launched on the inputs' device (the kernel launches on the current one) and its stream
            with torch.cuda.device(inputs[0].device):
                rc = fn(*args, torch.cuda.current_stream(inputs[0].device).cuda_stream)
        else:
            rc = fn(*args)
        if rc != 0:
            raise RuntimeError(f"{path.name}: {entry} returned {rc}")

    return launch


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Meta:
    """One tensor a kernel was verified for."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.shape, self.stride = tuple(d["shape"]), tuple(d["stride"])
        self.dtype = DTYPES[d["dtype"]][0]

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)

    def holds(self, t: torch.Tensor) -> bool:
        return t.dtype is self.dtype and tuple(t.shape) == self.shape and t.stride() == self.stride


class Form:
    """One implementation of a kernel: for one device type, from one backend."""

    def __init__(self, root: Path, namespace: str, e: dict[str, Any]) -> None:
        self.device_type, self.backend = e["device_type"], e["backend"]
        # machine code runs where it was built; a Python module where its package (triton, helion) is installed
        needs = frozenset(e.get("cpu_flags", ()))
        self.available = e.get("platform", _PLATFORM) == _PLATFORM and needs <= cpu_flags() and \
            (e["native"] or importlib.util.find_spec(e.get("module", "triton")) is not None)
        if not self.available:
            return
        if not e["native"]:  # a Triton or Helion module
            self.launch = _module(root / e["file"], f"{namespace}_{e['name']}_{e['backend']}").launch
        else:
            self.launch = _native(root / e["file"], e["entry"], self.device_type == "cuda")


class Kernel:
    """One exported kernel: its op (an implementation per device type: the forms), its guard and its reference.

    A kernel may have two forms in one package: the universal variant holds a CPU kernel (for the machine it was
    built on) beside the Triton form of the same task for CUDA devices; the op dispatches on the inputs' device.
    """

    def __init__(self, root: Path, namespace: str, lib: torch.library.Library, entries: list[dict[str, Any]]) -> None:
        e = entries[0]
        self.name = e["name"]
        self.inputs = [Meta(m) for m in e["inputs"]]
        self.outputs = [Meta(m) for m in e["outputs"]]
        self.reference = _module(root / e["reference"], f"{namespace}_ref_{self.name}").region
        forms = [Form(root, namespace, f) for f in entries]
        self.forms = {f.device_type: f for f in forms if f.available}
        self.device_type = next(iter(self.forms), e["device_type"])  # the first form's (one-form packages: its only)
        self.op: Any = None
        if not self.forms:
            return
        params = ", ".join(f"Tensor in{i}" for i in range(len(self.inputs)))
        lib.define(f"{self.name}({params}) -> Tensor[]")
        for dev, form in self.forms.items():
            lib.impl(self.name, self._runner(form), "CPU" if dev == "cpu" else "CUDA")
        torch.library.register_fake(f"{namespace}::{self.name}", self._fake, lib=lib)
        self.op = getattr(getattr(torch.ops, namespace), self.name)

    def _runner(self, form: Form) -> Callable[..., list[torch.Tensor]]:
        def run(*args: torch.Tensor) -> list[torch.Tensor]:
            outs = [m.empty(args[0].device) for m in self.outputs]
            form.launch(list(args), outs)
            return outs
        return run

    def _fake(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return [m.empty(args[0].device) for m in self.outputs]

    def applies(self, args: tuple[torch.Tensor, ...]) -> bool:
        """The guard: a form for the inputs' device, the inputs what the kernel was verified for, and no
        gradient asked for."""
        if not args or args[0].device.type not in self.forms or len(args) != len(self.inputs):
            return False
        if torch.is_grad_enabled() and any(a.requires_grad for a in args):
            return False
        dev = args[0].device.type
        return all(a.device.type == dev and m.holds(a) for a, m in zip(args, self.inputs, strict=True))

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The region's outputs: the kernel's where its guard holds, the reference's otherwise."""
        if self.applies(args):
            return tuple(self.op(*args))
        return tuple(self.reference(*args))


def load(root: Path) -> tuple[str, dict[str, Kernel]]:
    """The namespace and the kernels of the package in `root` (its kernels.json), each registered as an op."""
    spec = json.loads((root / "kernels.json").read_text())
    namespace = spec["namespace"]
    lib = torch.library.Library(namespace, "FRAGMENT")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in spec["kernels"]:
        by_name.setdefault(e["name"], []).append(e)
    kernels = {name: Kernel(root, namespace, lib, entries) for name, entries in by_name.items()}
    _LIBS.append(lib)  # a Library's ops live as long as it does
    return namespace, kernels


_LIBS: list[torch.library.Library] = []
