"""Calling a built candidate from the worker: ctypes for cpu/cuda libraries, import for Python (Triton, Helion)
modules.

Important: this module runs kernel code. The search and the judge never import it (import contracts in
pyproject.toml): candidates run only in the worker process (forge.evaluate.child); forge.runtime.dispatch uses
it for kernels that passed verification.
"""

from __future__ import annotations

import ctypes
import importlib.util
import io
import linecache
import threading
import traceback
import types
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from forge.backends import BACKENDS
from forge.capture.export import TensorMeta
from forge.kernel import DTYPE_CODES


class ForgeTensor(ctypes.Structure):
    """Mirror of ForgeTensor in forge_abi.h."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("stride", ctypes.POINTER(ctypes.c_int64))]


class LaunchError(Exception):
    """The candidate could not be called: missing entry point, bad return code, exception."""


class ForbiddenTorch(LaunchError):
    """A Python launcher ran a PyTorch compute op."""


# Metadata queries a launcher (or Triton's own launch code) may make; everything else is compute.
_METADATA = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "size", "stride",
             "numel", "dim", "detach", "alias", "_local_scalar_dense"}


class NoTorchCompute(TorchDispatchMode):
    """Raises ForbiddenTorch on any PyTorch op but views and metadata, while a launcher runs."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.is_view or func.overloadpacket.__name__ in _METADATA:
            return func(*args, **(kwargs or {}))
        raise ForbiddenTorch(f"the launcher ran PyTorch op {func} (only Triton kernels may compute)")


def _tensor_array(ts: list[torch.Tensor], keep: list[Any]) -> Any:
    arr = (ForgeTensor * max(len(ts), 1))()
    for i, t in enumerate(ts):
        shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        stride = (ctypes.c_int64 * max(t.dim(), 1))(*t.stride())
        keep += [shape, stride]
        arr[i] = ForgeTensor(t.data_ptr(), DTYPE_CODES[str(t.dtype).removeprefix("torch.")], t.dim(),
                             ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                             ctypes.cast(stride, ctypes.POINTER(ctypes.c_int64)))
    return arr


def _meta_array(metas: Sequence[TensorMeta], keep: list[Any]) -> Any:
    """ForgeTensor structs with the shapes and strides of `metas` and null data pointers."""
    arr = (ForgeTensor * max(len(metas), 1))()
    for i, m in enumerate(metas):
        shape = (ctypes.c_int64 * max(len(m.shape), 1))(*m.shape)
        stride = (ctypes.c_int64 * max(len(m.stride), 1))(*m.stride)
        keep += [shape, stride]
        i64 = ctypes.POINTER(ctypes.c_int64)
        arr[i] = ForgeTensor(None, DTYPE_CODES[m.dtype], len(m.shape), ctypes.cast(shape, i64),
                             ctypes.cast(stride, i64))
    return arr


class FixedCall:
    """A C or CUDA launcher for tensors of fixed shapes and strides: a call only writes the data pointers.

    What the dispatcher runs once its guards have checked the tensors against the metadata: no ctypes object
    is made per call. Important: the ForgeTensor arrays are shared, so a call holds a lock (another thread
    could swap the pointers during a launch otherwise), and the caller must have checked dtype, shape and
    stride.
    """

    def __init__(self, launcher: Launcher, inputs: Sequence[TensorMeta], outputs: Sequence[TensorMeta]) -> None:
        self.fn, self.cuda = launcher.c_fn, BACKENDS[launcher.backend].device == "cuda"
        self._keep: list[Any] = []
        self._ins, self._outs = _meta_array(inputs, self._keep), _meta_array(outputs, self._keep)
        size, offset = ctypes.sizeof(ForgeTensor), ForgeTensor.data.offset
        # the data fields of the structs, inputs then outputs, as ctypes objects to write into
        self._data = tuple(ctypes.c_void_p.from_address(ctypes.addressof(arr) + i * size + offset)
                           for arr, n in ((self._ins, len(inputs)), (self._outs, len(outputs))) for i in range(n))
        self._n_in, self._n_out = ctypes.c_int(len(inputs)), ctypes.c_int(len(outputs))
        self._lock = threading.Lock()
        self._ptrs: list[int] = []  # the data pointers now in the structs

    def __call__(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Launch on these tensors (on the current CUDA stream for a CUDA kernel); LaunchError if it fails."""
        ptrs = []  # a loop, not a comprehension: this runs on every dispatched call
        for t in inputs:
            ptrs.append(t.data_ptr())
        for t in outputs:
            ptrs.append(t.data_ptr())
        self._lock.acquire()  # not `with`: half the cost, and this runs on every dispatched call
        try:
            if ptrs != self._ptrs:  # the allocator often hands back the same addresses call after call
                for slot, p in zip(self._data, ptrs, strict=True):
                    slot.value = p
                self._ptrs = ptrs
            if self.cuda:
                stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
                ret = self.fn(self._ins, self._n_in, self._outs, self._n_out, stream)
            else:
                ret = self.fn(self._ins, self._n_in, self._outs, self._n_out)
        finally:
            self._lock.release()
        if ret != 0:
            raise LaunchError(f"forge_launch returned {ret}")


def _import(path: str) -> types.ModuleType:
    """A Python candidate imported from one read of its file: the text run is the text put in linecache, first
    and for good (no mtime: never re-checked against the file): Triton reads a kernel's source (inspect) at
    import, Helion at its first call, when the worker's staged copy is gone. Lines split at "\n" only, as
    Python's tokenizer does (str.splitlines also splits at \x0c, \x85, \u2028...: a comment would hide another
    kernel from the checks)."""
    name = f"forge_candidate_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LaunchError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        text = importlib.util.decode_source(Path(path).read_bytes())
    except OSError as e:
        raise LaunchError(f"cannot read {path}: {e}") from e
    linecache.cache[path] = (len(text), None, io.StringIO(text).readlines(), path)
    try:
        exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 - the candidate, in its worker
    except Exception as e:
        raise LaunchError(f"the module raised on import: {type(e).__name__}: {e}") from e
    return module


class Launcher:
    """A loaded candidate; `bind(inputs, outputs)` returns a no-argument call for timing loops."""

    def __init__(self, backend: str, path: str, entry: str) -> None:
        self.backend = backend
        if not BACKENDS[backend].native:  # a Python module
            module = _import(path)
            fn = getattr(module, entry, None)
            if not callable(fn):
                raise LaunchError(f"the module defines no callable `{entry}`")
            self.py_fn: Callable[..., Any] = fn
            self.module = module
            self._warmed: set[tuple[Any, ...]] = set()
        else:
            lib = ctypes.CDLL(path)
            try:
                self.c_fn = getattr(lib, entry)
            except AttributeError as e:
                raise LaunchError(f"the library exports no `{entry}` (declare it extern \"C\")") from e
            self.c_fn.restype = ctypes.c_int
            self.lib = lib

    def bind(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], guard: bool = False
             ) -> Callable[[], None]:
        """A call of the candidate on these tensors; raises LaunchError on a non-zero return.

        With `guard`, a Python launcher runs under NoTorchCompute (used while verifying).
        """
        if not BACKENDS[self.backend].native:
            fn = self.py_fn
            if guard and BACKENDS[self.backend].warm:
                self.warm(inputs, outputs)

            def call_py() -> None:
                if guard:
                    with NoTorchCompute():
                        ret = fn(inputs, outputs)
                else:
                    ret = fn(inputs, outputs)
                if isinstance(ret, int) and ret != 0:
                    raise LaunchError(f"launch returned {ret}")

            return call_py
        keep: list[Any] = []
        ins, outs = _tensor_array(inputs, keep), _tensor_array(outputs, keep)
        n_in, n_out = ctypes.c_int(len(inputs)), ctypes.c_int(len(outputs))
        c_fn = self.c_fn
        if BACKENDS[self.backend].device == "cuda":
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

            def call_cuda() -> None:
                _ = keep
                ret = c_fn(ins, n_in, outs, n_out, stream)
                if ret != 0:
                    raise LaunchError(f"forge_launch returned {ret}")

            return call_cuda

        def call_cpu() -> None:
            _ = keep
            ret = c_fn(ins, n_in, outs, n_out)
            if ret != 0:
                raise LaunchError(f"forge_launch returned {ret}")

        return call_cpu


    def warm(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        """Call a Python module once on scratch tensors of these shapes, strides and dtypes, outside the guard: a
        Helion kernel traces and compiles on its first call through PyTorch ops on fake tensors, which
        NoTorchCompute would refuse. What that call computes is thrown away; every judged call is guarded."""
        sig = tuple((t.dtype, tuple(t.shape), t.stride(), t.device.type) for t in [*inputs, *outputs])
        if sig in self._warmed:
            return
        scratch_in = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).zero_()
                      for t in inputs]
        scratch_out = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in outputs]
        try:
            self.py_fn(scratch_in, scratch_out)
        except Exception as e:
            where = "".join(traceback.format_tb(e.__traceback__, limit=-3))[-700:]
            raise LaunchError(f"the first call (compiling) raised: {type(e).__name__}: {str(e)[:500]}\n{where}") from e
        self._warmed.add(sig)


def call_on(launcher: Launcher, inputs: Sequence[TensorMeta], outputs: Sequence[TensorMeta]
            ) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]:
    """The kernel as a call on (inputs, outputs) of these shapes and strides: a FixedCall for C/CUDA, the module
    bound per call for Triton. What the dispatcher runs, and what a candidate is timed as."""
    if not BACKENDS[launcher.backend].native:
        return lambda ins, outs: launcher.bind(list(ins), list(outs))()
    # outputs are allocated in the layout kernels write (TensorMeta.written: row-major, or channels-last),
    # whatever else eager's output strides were: the kernel is told the strides it writes, as verification told it
    outputs = [m.written() for m in outputs]
    return FixedCall(launcher, inputs, outputs)
