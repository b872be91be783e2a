"""Hostile kernels evaluated several times on one device: status, claimed median and eager's, per evaluation.

For the spot check's kept calls (00c320e): `tests/corpus/*/skips_unless_kept.*` computes only when its output
address changes; before 00c320e the kept calls' input copies, made in their round, took the block the allocator
hands the outputs round after round, so kept calls computed and the rest skipped. Run from a tree of the commit
to compare (its forge/ first on PYTHONPATH) and from this one:

    python benchmarks/kept_address.py --device cuda --n 3 --json OUT.json tests/corpus/cuda/skips_unless_kept.cu ...

`--task mm` evaluates on a matrix product (`--shape M,K,N`) instead of SiLU: for
`benchmarks/hostile/incremental_mm.cpp`, which updates its last result for the input elements that changed since
its last call. Before forge.evaluate.measured's `renews`, every timed round changed 8 elements of each input, so
its calls cost a read of its inputs and it was timed far below the product's cost; now a matrix product's inputs
are drawn anew every round.

Prints a table and writes the rows as JSON, each with its commit, date and machine (benchmarks/provenance.py: the
commit of this script's checkout, or $FORGE_COMMIT) and the forge module it ran (which tree: old or this one).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from provenance import stamp  # benchmarks/, on sys.path as the script's folder

import forge
from forge.capture.export import capture
from forge.evaluate.evaluator import Evaluator
from forge.kernel import Candidate, TaskSpec
from forge.tasks.cut import build_tasks


class _Product(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=3, help="evaluations of each file")
    ap.add_argument("--task", choices=("silu", "mm"), default="silu")
    ap.add_argument("--shape", help="the SiLU input's shape (257,1000: the corpus's) or the product's M,K,N "
                                    "(256,256,256)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shape = [int(s) for s in (args.shape or ("257,1000" if args.task == "silu" else "256,256,256")).split(",")]
    if args.task == "silu":
        model, inputs = torch.nn.SiLU(), [torch.randn(*shape)]
    else:
        model, inputs = _Product(), [torch.randn(shape[0], shape[1]), torch.randn(shape[1], shape[2])]
    spec = TaskSpec.of(build_tasks(capture(model, inputs).graph_module.graph)[0])
    rows, where = [], stamp(args.device)
    with tempfile.TemporaryDirectory() as cache, Evaluator(args.device, timeout_s=120, cache_dir=Path(cache)) as ev:
        for i in range(args.n):
            for f in args.files:
                r = ev.evaluate(spec, Candidate.from_file(f))
                rows.append({"file": str(f), "run": i, "status": r.status.value,
                             "median_us": r.timing.median_us if r.timing else None,
                             "eager_us": r.baseline.median_us if r.baseline else None, "message": r.message[:200],
                             "forge": forge.__file__, "task": args.task, "shape": shape, **where})
                print(f"| {f.name} | {i} | {r.status.value} | "
                      f"{rows[-1]['median_us'] or 0:.1f} | {rows[-1]['eager_us'] or 0:.1f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
