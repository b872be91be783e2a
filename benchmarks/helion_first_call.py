"""An exported package's Helion kernels in a fresh process (issue 18): Helion's autotuner is a tripwire (an
exported kernel runs the config in its source), the first call (compile) and the steady state are timed, the
steady state beside the region's reference, and the steady call's
Python time is profiled (the top entries by own time).

    python benchmarks/helion_first_call.py EXPORT_DIR/build/torch-universal [--json OUT.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from helion.runtime.kernel import BoundKernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import stamp  # noqa: E402  (benchmarks/)


def no_tuning(*args: object, **kwargs: object) -> None:
    raise AssertionError("Helion autotuned an exported kernel")


def per_call_us(fn, n: int = 200) -> float:  # noqa: ANN001 - any callable
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def top(fn, n: int = 12) -> str:  # noqa: ANN001 - any callable
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("universal", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    BoundKernel.autotune = no_tuning
    (pkg,) = [p.name for p in args.universal.iterdir() if p.is_dir()]
    sys.path.insert(0, str(args.universal))
    k = __import__(pkg)
    rows = []
    for name, kernel in k._KERNELS.items():
        form = kernel.forms.get("cuda")
        if form is None or form.backend != "helion":
            print(f"{name}: no Helion form ({form.backend if form else 'none'})")
            continue
        ins = [m.empty(torch.device("cuda")).copy_(torch.randn(m.shape)) for m in kernel.inputs]
        outs = [m.empty(torch.device("cuda")) for m in kernel.outputs]
        torch.cuda.synchronize()
        t = time.perf_counter()
        rc = form.launch(ins, outs)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t) * 1e3
        steady = per_call_us(lambda: form.launch(ins, outs))  # noqa: B023 - called here
        ref = per_call_us(lambda: kernel.reference(*ins))  # noqa: B023 - called here
        err = max((o.float() - w.float()).abs().max().item() for o, w in zip(outs, kernel.reference(*ins), strict=True))
        row = {**stamp("cuda"), "kernel": name, "rc": rc, "first_call_ms": first_ms, "steady_us": steady,
               "reference_us": ref, "max_abs_err": err}
        rows.append(row)
        print(f"{name}: rc {rc}, first call {first_ms:.1f} ms (compile, no autotuning), steady {steady:.1f} us a "
              f"call (reference {ref:.1f}), max abs err {err:.2e}")
        print(top(lambda: form.launch(ins, outs)))  # noqa: B023 - called here
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
