"""Runs forge's verification of Triton modules under Triton's interpreter on CPU tensors, in a process of its own.

    TRITON_INTERPRET=1 python tests/triton_verify.py JOBS.pkl RESULTS.pkl

JOBS.pkl: a pickled list of (module path, TaskSpec, seed); RESULTS.pkl: per job (status, message, max error) of
forge.evaluate.verify.verify, or ("error", the exception's text, None). Forge judges Triton candidates on CUDA
devices only, the candidate in a worker and the judge in forge's process; here both share one interpreted
process, so that a recipe's numerics are judged on a machine without a GPU by the same input sets (the scales, the
hard values, a scan's input domains), reference and tolerances. It checks numerics, not isolation.
"""

import importlib.util
import os
import pickle
import sys
from collections.abc import Sequence

import torch

from forge.capture.export import TensorMeta
from forge.evaluate.verify import Reference, Target, verify


class Local(Target):
    """A module's `launch` called in this process on CPU tensors."""

    def __init__(self, launch) -> None:
        self.launch = launch

    def place(self, inputs: Sequence[TensorMeta], buffers: Sequence[tuple[int, torch.dtype]]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ins = []
        for m in inputs:
            span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.stride, strict=True))
            ins.append(torch.empty(span, dtype=m.torch_dtype).as_strided(m.shape, m.stride))
        return ins, [torch.empty(n, dtype=d) for n, d in buffers]

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        rc = self.launch(list(inputs), list(outputs))
        if rc != 0:
            raise RuntimeError(f"launch returned {rc}")

    def sync(self) -> None:
        pass


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    with open(sys.argv[1], "rb") as f:
        jobs = pickle.load(f)
    results = []
    for n, (path, spec, seed) in enumerate(jobs):
        try:
            found = importlib.util.spec_from_file_location(f"forge_verified_{n}", path)
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
            v = verify(Local(module.launch), Reference(spec.source), spec.inputs, spec.outputs, "cpu", seed)
            results.append((v.status.value, v.message, v.detail.get("max_err")))
        except Exception as e:  # reported to the test, which fails with it
            results.append(("error", f"{type(e).__name__}: {e}", None))
    with open(sys.argv[2], "wb") as f:
        pickle.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
