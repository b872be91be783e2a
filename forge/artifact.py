"""Artifacts: the winners of a run bundled under runs/<id>/ with a manifest, loadable with torch alone.

Layout: `runs/<id>/manifest.json` lists each kernel (task key, backend, entry, input and output
tensor metadata, the task's reference source for the fallback, the library file) and
`runs/<id>/kernels/<key>.so` (or `.py` for Triton). `load()` needs no database, LLM client or search
code: only forge.dispatch, which needs torch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from forge.capture import TensorMeta
from forge.dispatch import KernelArtifact, OptimizedModule, apply

FORMAT = "forge.artifact/1"


def save(folder: str | Path, kernels: list[KernelArtifact], info: dict[str, Any]) -> Path:
    """Copy each kernel's library into `folder`/kernels and write the manifest; returns its path."""
    folder = Path(folder)
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    entries = []
    for k in kernels:
        dst = folder / "kernels" / f"{k.key}{Path(k.path).suffix}"
        shutil.copyfile(k.path, dst)
        entries.append({"key": k.key, "backend": k.backend, "entry": k.entry, "file": f"kernels/{dst.name}",
                        "inputs": [m.to_json() for m in k.inputs], "outputs": [m.to_json() for m in k.outputs],
                        "source": k.source})
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"format": FORMAT, **info, "kernels": entries}, indent=1) + "\n")
    return manifest


def read(path: str | Path) -> list[KernelArtifact]:
    """The kernels of an artifact folder (or its manifest.json)."""
    path = Path(path)
    manifest = path if path.is_file() else path / "manifest.json"
    data = json.loads(manifest.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"Invalid artifact {manifest}: format {data.get('format')!r}, expected {FORMAT!r}")
    return [KernelArtifact(e["key"], e["backend"], str(manifest.parent / e["file"]), e["entry"],
                           tuple(TensorMeta.parse(m) for m in e["inputs"]),
                           tuple(TensorMeta.parse(m) for m in e["outputs"]), e["source"]) for e in data["kernels"]]


def load(path: str | Path, model: Any, inputs: list[Any], strict: bool = False) -> OptimizedModule:
    """Apply an artifact's kernels to `model` captured on `inputs`."""
    return apply(model, inputs, read(path), strict=strict)
