"""Runs Triton modules' `launch` under Triton's interpreter on CPU tensors, in a process of its own.

    TRITON_INTERPRET=1 python tests/triton_interpret.py JOBS.pt RESULTS.pt

JOBS.pt: a list of (module path, inputs, outputs) with the outputs allocated (NaN-filled); RESULTS.pt: per job the
launcher's return code and the outputs it wrote, or the exception's text. The interpreter must be on before triton
is imported (triton.language's own @jit helpers are interpreted only then), and generated kernels never run in
the process that judges them.
"""

import importlib.util
import os
import sys

import torch


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    jobs = torch.load(sys.argv[1])
    results = []
    for n, (path, inputs, outputs) in enumerate(jobs):
        try:
            spec = importlib.util.spec_from_file_location(f"forge_interpreted_{n}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            results.append((module.launch(inputs, outputs), outputs))
        except Exception as e:  # reported to the test, which fails with it
            results.append((f"{type(e).__name__}: {e}", None))
    torch.save(results, sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
