"""`forge export RUN --format hf-kernels DIR`: a run's kernels as a Hugging Face kernel repository.

The layout the `kernels` package (>= 0.19) loads with `get_local_kernel(DIR)` and `LocalLayerRepository`, in
kernel-builder's source layout:

    DIR/build.toml                      kernel-builder's configuration: the kernels' sources by backend
    DIR/README.md                       the card: device, shapes, measured speedups, how to kernelize
    DIR/torch-ext/<pkg>/                the package's source: __init__.py, _runtime.py, layers.py, kernels.json,
                                        kernels/<name>.cpp|.cu|.py, references/<name>.py
    DIR/build/<variant>/metadata.json   name, id, backend, and the digest the kernels package checks on load
    DIR/build/<variant>/<pkg>/          the package with the built kernels
    DIR/tests/test_<pkg>.py             each kernel against its reference, loaded with the kernels package

Variants: CPU kernels (C shared libraries with forge's C entry point, called through ctypes: they link neither
Python nor torch) go to the arch variant `torch<MAJ><MIN>-cxx11-cpu-<machine>-linux` of this torch, since they are
machine code; native CUDA ones to `torch<MAJ><MIN>-cxx11-cu<CUDA>-<machine>-linux`; Triton and Helion kernels,
which are Python (a Helion kernel with its tuned config in its source: it compiles on its first call, never
autotunes), to `torch-universal`. CPU kernels go to `torch-universal` too: the kernels package picks the backend from
the torch build, CUDA for a CUDA wheel even on a machine without a GPU (the default Linux wheel), and there it
takes no `cpu` variant; in the universal package a native kernel runs only on the machine and OS it was built for
(kernels.json's `platform`), its reference elsewhere. The libraries are the artifact's, checked against its hashes.

A scan's kernel (forge.capture.scans) is left out and said so: its reference calls the model's library through forge's
op, and an exported package needs torch alone.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forge.backends import BACKENDS
from forge.capture.layout import capture_in
from forge.capture.scans import calls_scan
from forge.errors import UserError
from forge.export import render
from forge.export.align import LayerSpec, layers
from forge.export.package._runtime import cpu_flags
from forge.kernel import KernelArtifact
from forge.review.data import find_run, task_view
from forge.runtime import artifact
from forge.store import Store

PACKAGE = Path(__file__).resolve().parent / "package"
UNIVERSAL = "torch-universal"


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    folder: Path
    name: str  # the kernel repository's name (metadata and build.toml)
    kernels: tuple[str, ...]
    layers: tuple[str, ...]
    variants: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # the keys of the run's scan kernels, which export does not write


def variants_of(backend: str) -> tuple[str, ...]:
    """The build variants a kernel of `backend` goes to, for this torch and machine (see the module doc)."""
    b = BACKENDS[backend]
    if not b.native:  # a Python (Triton, Helion) module
        return (UNIVERSAL,)
    ver = torch.__version__.split("+")[0].split(".")
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    dev = "cu" + "".join((torch.version.cuda or "0.0").split(".")[:2]) if b.device == "cuda" else b.device
    arch = f"torch{ver[0]}{ver[1]}-{abi}-{dev}-{platform.machine()}-{platform.system().lower()}"
    return (arch, UNIVERSAL) if b.device == "cpu" else (arch,)


def _digest(variant: Path) -> dict[str, Any]:
    """The digest the kernels package checks (sha256, base64, per file below the variant; not metadata.json
    nor __pycache__)."""
    files = {}
    for f in sorted(variant.rglob("*")):
        rel = f.relative_to(variant)
        if f.is_file() and rel.as_posix() != "metadata.json" and "__pycache__" not in rel.parts:
            files[rel.as_posix()] = base64.b64encode(hashlib.sha256(f.read_bytes()).digest()).decode()
    return {"algorithm": "sha256", "files": files}


def _entry(k: KernelArtifact, name: str, lib: bool) -> dict[str, Any]:
    b = BACKENDS[k.backend]
    file = f"kernels/{name}{Path(k.path).suffix}" if lib and b.native else f"kernels/{name}{b.suffix}"
    native = {"platform": f"{platform.machine()}-{platform.system().lower()}"} if b.native else {}
    if b.native and b.device == "cpu":  # built with -march=native: the CPU it may run on (see cpu_flags)
        native["cpu_flags"] = sorted(cpu_flags())
    python = {} if b.native else {"module": b.modules[0]}  # what a Python form needs installed to run
    return {**native, **python, "name": name, "key": k.key, "backend": k.backend, "native": b.native,
            "device_type": b.device, "entry": k.entry,
            "file": file, "reference": f"references/{name}.py", "inputs": [m.to_json() for m in k.inputs],
            "outputs": [m.to_json() for m in k.outputs]}


def python_forms(store: Store, run_id: str, kernels: list[KernelArtifact]) -> list[KernelArtifact]:
    """The no-arch form of each native kernel: its task's best Python (Triton or Helion) candidate that the run
    verified (status ok, the highest reward), for the universal variant; none for a task without one (a CPU run
    has none)."""
    tasks = {t.key: t for t in store.get_tasks(run_id)}
    out = []
    for k in kernels:
        if not BACKENDS[k.backend].native or k.key not in tasks:
            continue
        # the task's root (backend "eager": the reference the search started from) is no form of a kernel
        ok = [c for c in store.candidates(tasks[k.key].id) if c.backend in BACKENDS and not BACKENDS[c.backend].native
              and c.status == "ok" and all(e.status == "ok" for e in store.evaluations(c.id))]  # none found wrong
        if ok:
            best = max(ok, key=lambda c: (c.reward if c.reward is not None else float("-inf"), -c.id))
            out.append(dataclasses.replace(k, backend=best.backend, path="", entry=best.entry,
                                           kernel_source=best.source))
    return out


def _package(dst: Path, pyname: str, namespace: str, kernels: list[tuple[KernelArtifact, render.Exported]],
             specs: dict[str, tuple[LayerSpec, str]], built: bool) -> None:
    """The Python package at `dst`: with the built kernels (`built`, a build variant) or their sources
    (torch-ext)."""
    (dst / "kernels").mkdir(parents=True, exist_ok=True)
    (dst / "references").mkdir(exist_ok=True)
    shutil.copyfile(PACKAGE / "_runtime.py", dst / "_runtime.py")
    for k, e in kernels:
        (dst / "references" / f"{e.name}.py").write_text(k.source)
        if built and BACKENDS[k.backend].native:
            shutil.copyfile(k.path, dst / "kernels" / f"{e.name}{Path(k.path).suffix}")
        else:  # a source, or a Python module (built is the source)
            (dst / "kernels" / f"{e.name}{BACKENDS[k.backend].suffix}").write_text(k.kernel_source)
    entries = [_entry(k, e.name, built) for k, e in kernels]
    (dst / "kernels.json").write_text(json.dumps({"namespace": namespace, "kernels": entries}, indent=1) + "\n")
    (dst / "__init__.py").write_text(render.init_py(pyname, [e for _, e in kernels], sorted(specs)))
    (dst / "layers.py").write_text(render.layers_py(specs))


def _exported(k: KernelArtifact, stats: dict[str, tuple[float | None, float | None, str]]) -> render.Exported:
    eager, best, family = stats.get(k.key, (None, None, ""))
    return render.Exported(k.key.replace("-", "_"), k.key, k.backend, family, tuple(m.short() for m in k.inputs),
                           k.outputs[0].dtype if k.outputs else "float32", eager, best)


def _stats(store: Store, run_id: str) -> dict[str, tuple[float | None, float | None, str]]:
    """Per task key: eager's and the chosen kernel's median (us) in the search, and the task's family."""
    out = {}
    for t in store.get_tasks(run_id):
        tv = task_view(store, t)
        out[t.key] = (tv.eager_us, tv.best_us, t.family)
    return out


def kernels_of(store: Store, ref: str, model: torch.nn.Module, inputs: list[Any]
               ) -> tuple[dict[str, Any], dict[str, Any], list[KernelArtifact]]:
    """The run's record (as a dict), its artifact's manifest and its kernels (each file checked), with their
    references rendered from `model` (never the manifest's text: forge.runtime.artifact)."""
    try:
        run = find_run(store, ref)
    except KeyError as e:
        raise UserError(str(e.args[0])) from None
    folder = run.config.get("artifact")
    if not folder:
        raise UserError(f"run {run.id} has no artifact (it did not finish: forge optimize --resume {run.id})")
    _, data = artifact.manifest_of(folder)
    kernels = artifact.read(folder, model, inputs)
    if not kernels:
        named = artifact.variant_of(data).get("name")
        why = data.get("note") or (f"the fastest of its variants end to end was {named!r}, which uses none" if named
                                   else "nothing was faster")
        raise UserError(f"run {run.id}'s artifact has no kernels to export ({why})")
    info = {"run_id": run.id, "model": run.model, "eager_ms": run.eager_ms, "forge_ms": run.forge_ms,
            "variant": artifact.variant_of(data)}
    return info, data, kernels


def export(store: Store, ref: str, model: torch.nn.Module, inputs: list[Any], folder: str | Path,
           name: str | None = None) -> ExportResult:
    """Write run `ref`'s kernels as a kernel repository in `folder` (see the module doc); `model` on `inputs` is
    the run's model (its capture tells which kernels are one module: forge.export.align)."""
    if name is not None and not re.fullmatch(r"[a-z][a-z0-9-]{0,63}", name):
        raise UserError(f"Invalid --name: {name!r} (lowercase letters, digits and '-', starting with a letter)")
    info, data, kernels = kernels_of(store, ref, model, inputs)
    left_out = tuple(k.key for k in kernels if calls_scan(k.source))
    kernels = [k for k in kernels if k.key not in left_out]
    if not kernels:
        raise UserError(f"run {info['run_id']}'s kernels are all scans, which export does not write (their reference "
                        "calls the model's library through forge; a package needs torch alone)")
    name = name or re.sub(r"[^a-z0-9-]+", "-", f"forge-{info['run_id']}".lower()).strip("-")
    pyname = name.replace("-", "_")
    digest = hashlib.sha256(b"".join(Path(k.path).read_bytes() + k.kernel_source.encode() for k in kernels))
    namespace = f"_{pyname}_{digest.hexdigest()[:10]}"
    cap = capture_in(model, inputs, data.get("layout", ""))
    by_class = layers(model, cap, {k.key for k in kernels})
    stats = _stats(store, info["run_id"])
    pairs = [(k, _exported(k, stats)) for k in kernels]
    names = {k.key: e.name for k, e in pairs}
    forms = [(k, dataclasses.replace(names_of(k, pairs), backend=k.backend, kernel_us=None))
             for k in python_forms(store, info["run_id"], kernels)]
    pairs += forms
    specs = {cls: (s, names[s.key]) for cls, s in by_class.items()}
    root = Path(folder)
    if root.exists() and any(root.iterdir()):
        raise UserError(f"{root} exists and is not empty: export into a new folder")
    by_variant: dict[str, list[tuple[KernelArtifact, render.Exported]]] = {}
    for k, e in pairs:
        for v in variants_of(k.backend):
            by_variant.setdefault(v, []).append((k, e))
    _package(root / "torch-ext" / pyname, pyname, namespace, pairs, specs, built=False)
    for variant, members in sorted(by_variant.items()):
        here = {e.name for _, e in members}
        vdir = root / "build" / variant
        _package(vdir / pyname, pyname, namespace, members,
                 {c: (s, n) for c, (s, n) in specs.items() if n in here}, built=True)
        backend = "universal" if variant == UNIVERSAL else BACKENDS[members[0][0].backend].device
        meta = {"name": name, "id": f"{namespace}_{variant.replace('-', '_')}", "version": 1,
                "license": "apache-2.0", "backend": {"type": backend}, "python-depends": [],
                "digest": _digest(vdir)}
        (vdir / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    (root / "tests").mkdir()
    (root / "tests" / f"test_{pyname}.py").write_text(render.test_py(pyname, [e for _, e in pairs]))
    backends = sorted({BACKENDS[k.backend].device for k, _ in pairs})
    (root / "build.toml").write_text(render.build_toml(name, [e for _, e in pairs], backends))
    (root / "README.md").write_text(render.card(name, {**data, **info}, [e for _, e in pairs], specs,
                                                sorted(by_variant)))
    return ExportResult(root, name, tuple(names.values()), tuple(sorted(specs)), tuple(sorted(by_variant)), left_out)


def names_of(k: KernelArtifact, pairs: list[tuple[KernelArtifact, render.Exported]]) -> render.Exported:
    """The exported description of the kernel of k's task."""
    return next(e for a, e in pairs if a.key == k.key)
