"""Model input: a KernelBench-convention file or a zoo model -> (module, example inputs) on a device.

A model file defines `Model` (an nn.Module), `get_inputs()` (its forward arguments) and optionally
`get_init_inputs()` (Model's constructor arguments). Every way this can go wrong raises UserError with
one line that says what is wrong and how to fix it.

Mode: a file's model runs in the mode it was constructed in (an nn.Module's default is training: BatchNorm
normalises by the batch's statistics and updates its running ones, dropout is random), as KernelBench's own
harness runs it (under no_grad); `eval=True` (`--eval`) puts it in inference mode first. Zoo models are
inference reference models: always in eval mode.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from forge.capture.export import DTYPES
from forge.errors import UserError

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda", "meta")


@dataclass
class LoadedModel:
    """A model ready to capture: in its mode, on its device, in its dtype, with example inputs."""

    name: str  # the file path, or "zoo:NAME"
    model: torch.nn.Module
    inputs: list[Any]
    device: str
    dtype: str  # "fp32" | "bf16" | "fp16"

    @property
    def mode(self) -> str:
        """"train" or "eval": the mode the model is in (and is captured, searched and measured in)."""
        return mode_of(self.model)


def mode_of(model: torch.nn.Module) -> str:
    """"train" when the model (or any of its submodules) is in training mode, else "eval"."""
    return "train" if any(m.training for m in model.modules()) else "eval"


@contextlib.contextmanager
def state_kept(model: torch.nn.Module) -> Iterator[None]:
    """Run a block and then put the model's buffers back as they were (in place: graphs holding them see it).

    Important: in training mode a forward changes state (BatchNorm's running statistics, num_batches_tracked);
    forge's own calls of the model (checks, timings, comparisons) must not leave it changed."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                if b.shape == v.shape and b.dtype == v.dtype and not torch.equal(b, v):
                    b.copy_(v)  # only where changed: a buffer's version is how forge sees a change in place


def check_device(device: str) -> str:
    """Validate a --device value; raises UserError when CUDA is asked for and absent."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise UserError(f"unknown device {device!r}: use one of cpu, cuda, cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        build = torch.version.cuda or "no CUDA"
        raise UserError(f"--device {device} asked for, but no CUDA GPU is available here (torch "
                        f"{torch.__version__}, {build}); use --device cpu")
    return device


def check_dtype(dtype: str) -> torch.dtype:
    """Validate a --dtype value."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


class _RedirectCuda(TorchFunctionMode):
    """Sends tensors a model file puts on "cuda" (device=..., .cuda(), .to("cuda")) to `target` instead."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = torch.device(target)

    def _fix(self, d: Any) -> Any:
        if isinstance(d, (str, torch.device)) and torch.device(d).type == "cuda":
            return self.target
        return d

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0].to(self.target)
        if "device" in kwargs:
            kwargs["device"] = self._fix(kwargs["device"])
        if func is torch.Tensor.to:
            args = tuple(self._fix(a) for a in args)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _building_on(device: str) -> Iterator[None]:
    """Construct on `device`: meta tensors without memory, "cuda" in the file redirected when absent."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.device(device))
        if device == "meta" or not torch.cuda.is_available():
            stack.enter_context(_RedirectCuda(device))
        if device == "meta":  # distributions validate arguments with .item(), which meta cannot do
            validate = torch.distributions.Distribution._validate_args
            torch.distributions.Distribution.set_default_validate_args(False)
            stack.callback(torch.distributions.Distribution.set_default_validate_args, validate)
        yield


def _where(e: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
    return f" (line {frames[-1].lineno})" if frames else ""


def check_file(path: str | Path) -> Path:
    """`path` as a model file that exists and is no folder (nothing imported); UserError otherwise."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"model file not found: {path} (give the path of a .py file defining Model, "
                        "get_inputs and get_init_inputs)")
    if path.is_dir():
        raise UserError(f"{path} is a folder: give the path of a .py model file")
    return path


def _import_file(path: Path) -> Any:
    check_file(path)
    name = f"forge_model_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {path}: is it a Python (.py) file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit and KeyboardInterrupt in a user file are errors too
        if isinstance(e, KeyboardInterrupt):
            raise
        raise UserError(f"{path} raised on import{_where(e, path.resolve())}: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")) from e
    return module


def _move(x: Any, device: str, dtype: torch.dtype, where: str) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (bool, int, float)):
        return x
    raise UserError(f"{where} returned a {type(x).__name__}, not a tensor: get_inputs() must return a "
                    "list of tensors (numbers are allowed as constant arguments)")


def load_file(path: str | Path, device: str = "cpu", dtype: str = "fp32", seed: int = 0,
              eval: bool = False) -> LoadedModel:
    """Load a KernelBench-convention model file in the mode it is constructed in (`eval`: inference mode);
    device "meta" builds it without memory."""
    path = Path(path)
    check_device(device)
    torch_dtype = check_dtype(dtype)
    module = _import_file(path)
    cls = getattr(module, "Model", None)
    if cls is None:
        raise UserError(f"{path} defines no `Model` class: a model file must define Model (an nn.Module), "
                        "get_inputs() and get_init_inputs()")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise UserError(f"{path}: `Model` must be a subclass of torch.nn.Module, not {type(cls).__name__}")
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_inputs):
        raise UserError(f"{path} defines no get_inputs(): add a function returning the list of forward "
                        "arguments (tensors)")
    get_init = getattr(module, "get_init_inputs", None)
    if get_init is not None and not callable(get_init):
        raise UserError(f"{path}: get_init_inputs must be a function returning Model's constructor arguments")
    torch.manual_seed(seed)
    build_device = "meta" if device == "meta" else "cpu"
    try:
        with _building_on(build_device):
            init = list(get_init()) if get_init else []
            model = cls(*init)
            raw = get_inputs()
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{path}: building Model or its inputs failed{_where(e, path.resolve())}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    if isinstance(raw, torch.Tensor) or not isinstance(raw, (list, tuple)):
        raise UserError(f"{path}: get_inputs() must return a list of tensors, not {type(raw).__name__}")
    inputs = [_move(x, device, torch_dtype, f"{path}: get_inputs()[{i}]") for i, x in enumerate(raw)]
    if not any(isinstance(x, torch.Tensor) for x in inputs):
        raise UserError(f"{path}: get_inputs() returned no tensor; it must return the forward's tensors")
    model = model.to(device=device, dtype=torch_dtype)
    if eval:
        model.eval()
    loaded = LoadedModel(str(path), model, inputs, device, dtype)
    if device != "meta":
        check_runs(loaded)
    return loaded


def load_zoo(name: str, device: str = "cpu", dtype: str = "fp32", **sizes: int | None) -> LoadedModel:
    """Build a reference model from the zoo (random weights, config shipped with forge), in eval mode: zoo models
    are inference reference models."""
    check_device(device)
    torch_dtype = check_dtype(dtype)
    from forge.capture import zoo

    try:
        model, inputs = zoo.build(name, device=device, dtype=torch_dtype, **sizes)
    except (ValueError, ImportError) as e:
        raise UserError(str(e)) from e
    model.eval()
    return LoadedModel(f"zoo:{name}", model, inputs, device, dtype)


def check_runs(loaded: LoadedModel) -> None:
    """Run the model once on its inputs (its buffers kept as they were); a failure (e.g. a dtype it cannot
    take) is a UserError."""
    try:
        with torch.no_grad(), state_kept(loaded.model):
            loaded.model(*loaded.inputs)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = "; try --dtype fp32" if loaded.dtype != "fp32" else ""
        raise UserError(f"{loaded.name} does not run in {loaded.dtype} on {loaded.device}: "
                        f"{type(e).__name__}: {msg}{hint}") from e
