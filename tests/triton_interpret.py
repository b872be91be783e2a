"""Runs Triton or Helion modules' `launch` under Triton's interpreter on CPU tensors, in a process of its own (a
Helion module: the Triton that Helion generates for it, with its config).

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


def _libdevice_for_the_interpreter() -> None:
    """Triton's interpreter runs `tl.math` but not `libdevice`, whose functions are stubs there (they return None);
    the Triton that Helion generates calls libdevice (exp, tanh, ...): route each to the interpreter's `tl.math`
    function of that name, or to an expression of them, looked up at call time (the interpreter patches tl.math
    only while a kernel runs)."""
    import triton.language as tl
    from triton.language.extra import libdevice

    math = {n: (lambda *a, n=n, **k: getattr(tl.math, n)(*a, **k)) for n in dir(libdevice)
            if not n.startswith("_") and hasattr(tl.math, n)}
    math.update(tanh=lambda x: 2.0 * tl.sigmoid(2.0 * x) - 1.0, log1p=lambda x: tl.math.log(1.0 + x),
                expm1=lambda x: tl.math.exp(x) - 1.0)
    for name, fn in math.items():
        setattr(libdevice, name, fn)


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    _libdevice_for_the_interpreter()
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
