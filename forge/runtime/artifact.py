"""Artifacts: the winners of a run bundled under runs/<id>/ with a manifest, loadable with torch alone.

Layout: `runs/<id>/manifest.json` lists each kernel (task key, backend, entry, input and output
tensor metadata, the task's reference source, the library file and the kernel's source file, each with its
SHA-256) and `runs/<id>/kernels/<key>.so` (or `.py` for Triton) with `<key>.src.cpp|cu|py`, with the
device model the kernels were tuned and verified on, and the variant the result is (forge.runtime.variants: kernels
or not, whole-graph rewrites, runtime) and the layout the graph was captured in (forge.capture.layout), which `load`
rebuilds.

Integrity (issue 13): `read` and `load` refuse (ArtifactError, one line) a manifest whose file names leave
the artifact folder, a file whose SHA-256 is not the recorded one, or an entry without a hash. No text from
the manifest is executed: a kernel's fallback, and the reference it is verified against with
`verify=True`, are rendered from the model `load` is given. The bytes checked are the bytes used: each library
is loaded from a private copy of what was hashed, not from the folder (which may change after the check).

`load()` needs no database, LLM client or search code: only forge.runtime.dispatch, which needs torch. On another
device model (another CPU, whose `-march=native` code may not even run, or another GPU) the kernels are not
used until `load(..., verify=True)` has verified and timed each one there, in a worker process, and kept
those that pass and beat eager.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import secrets
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from forge.backends import BACKENDS
from forge.capture.export import Capture, TensorMeta
from forge.capture.layout import LAYOUTS, capture_in
from forge.errors import UserError
from forge.evaluate.build import file_sha256 as sha256
from forge.evaluate.devices import device_model  # noqa: F401 - forge.runtime.artifact.device_model, as before
from forge.kernel import KernelArtifact
from forge.runtime.dispatch import apply
from forge.runtime.result import ForgeModel
from forge.tasks.cut import build_tasks

FORMAT = "forge.artifact/1"
log = logging.getLogger(__name__)


class ArtifactError(UserError):
    """An artifact that is malformed or not what was saved: a file outside its folder, a changed file."""




def save(folder: str | Path, kernels: list[KernelArtifact], info: dict[str, Any]) -> Path:
    """Copy each kernel's library (and write its source) into `folder`/kernels, and write the manifest with
    the SHA-256 of every file; returns the manifest's path."""
    folder = Path(folder)
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    entries = []
    for k in kernels:
        dst = folder / "kernels" / f"{k.key}{Path(k.path).suffix}"
        shutil.copyfile(k.path, dst)
        suffix = BACKENDS[k.backend].source_suffix if k.backend in BACKENDS else ".src.txt"
        src = folder / "kernels" / f"{k.key}{suffix}"
        src.write_text(k.kernel_source)
        entries.append({"key": k.key, "backend": k.backend, "entry": k.entry, "file": f"kernels/{dst.name}",
                        "sha256": sha256(dst), "kernel_source": f"kernels/{src.name}", "kernel_source_sha256":
                        sha256(src), "inputs": [m.to_json() for m in k.inputs],
                        "outputs": [m.to_json() for m in k.outputs], "source": k.source})
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"format": FORMAT, **info, "kernels": entries}, indent=1) + "\n")
    return manifest


def manifest_of(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The manifest file of an artifact folder (or the file itself) and its contents."""
    path = Path(path)
    manifest = path if path.is_file() else path / "manifest.json"
    try:
        return manifest, json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"Invalid artifact {path}: cannot read {manifest.name}: {e}") from e


def read(path: str | Path, model: Any = None, inputs: list[Any] | None = None) -> list[KernelArtifact]:
    """The kernels of an artifact folder (or its manifest.json), each file checked (see the module doc).
    Their reference `source` is rendered from `model` on `inputs` when given (kernels whose task is not in
    it are left out), else empty: the manifest's text is never what runs."""
    manifest, data = manifest_of(path)
    kernels = _kernels(manifest, data)
    if model is None or inputs is None:
        return [replace(k, source="") for k in kernels]
    return _local_references(kernels, capture_in(model, inputs, _layout(manifest, data)))


def _checked(manifest: Path, entry: dict[str, Any], name: str, digest: str) -> bytes:
    """The bytes of the file `entry[name]` inside the artifact folder, with the SHA-256 `entry[digest]`; else
    ArtifactError."""
    root = manifest.parent.resolve()
    rel, want = entry.get(name), entry.get(digest)
    if not isinstance(rel, str) or not isinstance(want, str):
        raise ArtifactError(f"Invalid artifact {manifest}: kernel {entry.get('key')!r} has no {name} with a "
                            f"{digest} (saved before artifacts had hashes? run forge optimize again)")
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise ArtifactError(f"Invalid artifact {manifest}: {name} {rel!r} of kernel {entry.get('key')!r} is not "
                            "a file inside the artifact folder")
    data = path.read_bytes()  # read once: what is hashed is what is used (the folder may change after)
    if hashlib.sha256(data).hexdigest() != want:
        raise ArtifactError(f"Invalid artifact {manifest}: {rel} of kernel {entry.get('key')!r} was changed "
                            "since it was saved (SHA-256 differs): refusing to load it")
    return data


def _private_copy(name: str, data: bytes) -> Path:
    """`data` as `name` in a folder of this process's own (mode 0700, removed at exit): the checked bytes
    are what is loaded, whatever is written into the artifact folder after the check."""
    folder = Path(tempfile.mkdtemp(prefix="forge-artifact-"))
    atexit.register(shutil.rmtree, folder, True)
    dst = folder / name
    dst.write_bytes(data)
    return dst


def _kernels(manifest: Path, data: dict[str, Any]) -> list[KernelArtifact]:
    if data.get("format") != FORMAT:
        raise ArtifactError(f"Invalid artifact {manifest}: format {data.get('format')!r}, expected {FORMAT!r}")
    out = []
    for e in data.get("kernels", []):
        lib = _private_copy(Path(e["file"]).name, _checked(manifest, e, "file", "sha256"))
        src = _checked(manifest, e, "kernel_source", "kernel_source_sha256").decode(errors="replace")
        out.append(KernelArtifact(e["key"], e["backend"], str(lib), e["entry"],
                                  tuple(TensorMeta.parse(m) for m in e["inputs"]),
                                  tuple(TensorMeta.parse(m) for m in e["outputs"]), e["source"], src))
    return out


def load(path: str | Path, model: Any, inputs: list[Any], strict: bool = False, verify: bool = False
         ) -> torch.nn.Module:
    """Apply an artifact's kernels to `model` captured on `inputs`.

    Kernels tuned on another device model than this one are left out (eager runs instead, with a
    warning; `strict` raises) unless `verify`: then each is verified and timed here first, and kept only
    if it passes and is faster than eager."""
    manifest, data = manifest_of(path)
    kernels = _kernels(manifest, data)
    by_device: dict[str, list[KernelArtifact]] = {}
    for k in kernels:
        by_device.setdefault(BACKENDS[k.backend].device, []).append(k)
    keep: list[KernelArtifact] = []
    layout = _layout(manifest, data)
    # captured once, when verification needs the model's own references or the kernels another layout
    cap: Capture | None = capture_in(model, inputs, layout) if layout else None
    for device, ks in by_device.items():
        here, tuned = device_model(device), data.get("device_model")
        if tuned == here:
            keep += ks
        elif verify:
            cap = cap or capture_in(model, inputs, layout)
            keep += verified_here(_local_references(ks, cap), device)
        else:
            msg = (f"the kernels of {path} were tuned on {tuned or 'an unrecorded device'}, this is {here}: "
                   "not used (load with verify=True to verify and time them here first)")
            if strict:
                raise RuntimeError(msg)
            log.warning(msg)
    if "variant" not in data:  # from before variants: kernels, a CUDA graph if it says so (what variant_of reads)
        opt = apply(model, inputs, keep, strict=strict, cuda_graph=bool(data.get("cuda_graph")), cap=cap)
        return ForgeModel.patched_graph(opt)
    from forge.runtime.variants import Variant, build

    try:
        variant = Variant.parse(data["variant"])
    except ValueError as e:
        raise ValueError(f"Invalid artifact {manifest}: {e}") from e
    device = "cuda" if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs) else "cpu"
    fn, _, _ = build(model, inputs, keep, variant, device, strict=strict, cap=cap)
    return fn


def variant_of(data: dict[str, Any]) -> dict[str, Any]:
    """The variant (Variant.to_json) `load` rebuilds from a manifest's `data`: an artifact from before variants is
    its kernels, replayed as a CUDA graph when it says so (load's first branch); {} for a malformed one."""
    from forge.runtime.variants import Variant

    if "variant" not in data:
        return Variant(True, (), "cuda-graph" if data.get("cuda_graph") else "graph").to_json()
    try:
        return Variant.parse(data["variant"]).to_json()
    except ValueError:
        return {}


def _layout(manifest: Path, data: dict[str, Any]) -> str:
    """The layout the artifact's graph was captured in (forge.capture.layout); ArtifactError on an unknown one."""
    layout = data.get("layout", "")
    if layout not in LAYOUTS:
        raise ArtifactError(f"Invalid artifact {manifest}: layout {layout!r}, expected one of {LAYOUTS}")
    return str(layout)


def _local_references(kernels: list[KernelArtifact], cap: Capture) -> list[KernelArtifact]:
    """The kernels whose task is in the captured model, each with that task's reference source rendered from
    the model (not the manifest's text)."""
    tasks = {t.key: t for t in build_tasks(cap.graph_module.graph)}
    return [replace(k, source=tasks[k.key].source) for k in kernels if k.key in tasks]


def verified_here(kernels: list[KernelArtifact], device: str) -> list[KernelArtifact]:
    """The kernels that pass verification on this device and beat eager here (each in a worker process)."""
    from forge.evaluate.parent import Worker
    from forge.evaluate.steps import EvalRequest
    from forge.kernel import TaskSpec

    keep = []
    with Worker(device) as worker:
        for k in kernels:
            spec = TaskSpec(k.key, k.source, k.inputs, k.outputs, sum(m.nbytes for m in (*k.inputs, *k.outputs)))
            res = worker.request(EvalRequest(spec, k.backend, k.path, k.entry, seed=secrets.randbits(40)),
                                 timeout_s=120.0)
            if res.status.passed and (res.speedup or 0.0) > 1.0:
                keep.append(k)
            else:
                log.warning("kernel %s not used on this device: %s %s (speedup %s)", k.key, res.status.value,
                            res.message[:200], f"{res.speedup:.2f}" if res.speedup else "-")
    return keep
