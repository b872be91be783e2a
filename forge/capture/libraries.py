"""Model libraries that trace other code than they run: told, while forge exports, that they are not exporting.

transformers asks `is_torchdynamo_exporting()` (torch.compiler.is_exporting) to pick code for export targets
that lack some ops: under torch.export, the gated delta rule of Qwen 3.5 (and Qwen3-Next, OLMo-hybrid) builds the
inverse of its triangular system by a forward substitution of 63 sliced updates instead of the two
`linalg.solve_triangular` calls eager makes, and causal masks are materialised where eager lets attention
apply causality itself. forge's graph runs on the machine it was captured for, where every ATen op exists, and
it must be what eager runs: a search over a different algorithm optimises code the user never runs (Qwen 3.5's
graph ran 4x slower than eager on an H200, 2026-12-02). So while forge exports, every transformers module that
imported the check sees one answering False, except those that also ask `is_torchdynamo_compiling()`: they pair
the two to tell torch.compile from export (Mamba, Jamba, Zamba and FalconMamba take an `associative_scan`
when "compiling and not exporting", which eager never runs; hub kernels are skipped under export), and a
patched half of the pair would send the capture down the compile path. torch's own check is left alone
(torch.export relies on it), and so are transformers' tracing checks that keep data-dependent branches out of
the graph (`is_tracing`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

CHECK = "is_torchdynamo_exporting"
PAIRED = "is_torchdynamo_compiling"  # a module that asks this too keeps the real check (see the module doc)


def _not_exporting() -> bool:
    return False


@contextmanager
def as_eager() -> Iterator[None]:
    """While inside, transformers' modules (those already imported, but not those that pair the check with
    `is_torchdynamo_compiling`) see `is_torchdynamo_exporting() == False`."""
    source = sys.modules.get("transformers.utils.import_utils")
    original = getattr(source, CHECK, None) if source is not None else None
    patched: list[ModuleType] = []
    if original is not None:
        for name, module in list(sys.modules.items()):
            if (name == "transformers" or name.startswith("transformers.")) and module is not None \
                    and vars(module).get(CHECK) is original and PAIRED not in vars(module):
                setattr(module, CHECK, _not_exporting)
                patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            setattr(module, CHECK, original)
