"""KernelBench "never slower": `forge optimize` on a list of problem files, one subprocess each.

Each file runs `forge optimize FILE --budget N --seconds S --json ...` in its own process (its own SQLite
file, runs/ folder and a wall-clock timeout), and the script prints one row per file: eager and forge
milliseconds, speedup, whether the kernels were applied, whether the outputs matched, and the error (the
last stderr line) if the run failed. forge keeps the eager model whenever the patched one is not faster,
so every speedup must be >= 1.0; a row below that, or any error, is a bug.

KernelBench files are not part of forge. The original level-2 shapes are sized for a GPU; on a CPU use
copies with module-level sizes shrunk (batch, channels, spatial sizes), for example:

    python benchmarks/kernelbench_optimize.py /work/kb/small/level2/{1,12,17,21}_*.py --budget 8 --seconds 30
    python benchmarks/kernelbench_optimize.py --device cuda KernelBench/level2/*.py --budget 48

Exit status: 0 if every file ran and none was slower, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    """One problem file's outcome."""

    file: str
    eager_ms: float | None = None
    forge_ms: float | None = None
    speedup: float | None = None
    applied: bool | None = None
    outputs_match: bool | None = None
    improved: int = 0  # tasks whose kernel beat eager by 5%
    seconds: float = 0.0
    error: str = ""


def run_one(path: Path, args: argparse.Namespace, work: Path) -> Row:
    """forge optimize on one file in a subprocess; the JSON report or the last stderr line."""
    out = work / f"{path.stem}.json"
    cmd = [sys.executable, "-m", "forge.cli", "optimize", str(path.resolve()), "--device", args.device,
           "--budget", str(args.budget), "--seconds", str(args.seconds), "--json", str(out),
           "--db", str(work / f"{path.stem}.db")]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout,
                              env={"PYTHONPATH": str(ROOT), **_env()})
    except subprocess.TimeoutExpired:
        return Row(path.name, seconds=time.monotonic() - start, error=f"timeout after {args.timeout:.0f} s")
    seconds = time.monotonic() - start
    if proc.returncode != 0 or not out.is_file():
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or [f"exit {proc.returncode}"]
        return Row(path.name, seconds=seconds, error=lines[-1][:160])
    r = json.loads(out.read_text())
    return Row(path.name, r["eager_ms"], r["forge_ms"], r["speedup"], r["applied"], r["outputs_match"],
               sum(t["status"] == "improved" for t in r["tasks"]), seconds)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(rows: list[Row]) -> None:
    """A Markdown table of the rows."""
    print("| file | eager ms | forge ms | speedup | applied | outputs_match | improved tasks | s | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.file} | {_f(r.eager_ms, '.3f')} | {_f(r.forge_ms, '.3f')} | {_f(r.speedup, '.2f')} | "
              f"{'-' if r.applied is None else r.applied} | {'-' if r.outputs_match is None else r.outputs_match} | "
              f"{r.improved} | {r.seconds:.0f} | {r.error} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="KernelBench problem files")
    p.add_argument("--device", default="cpu")
    p.add_argument("--budget", type=int, default=8, help="candidates per file (over all its tasks)")
    p.add_argument("--seconds", type=float, default=30.0, help="search wall time per file")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a file's run is killed")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-kb-") as tmp:
        for path in args.files:
            rows.append(run_one(path, args, Path(tmp)))
            r = rows[-1]
            print(f"{r.file}: {r.error or f'{r.speedup:.2f}x applied={r.applied}'} ({r.seconds:.0f} s)",
                  file=sys.stderr, flush=True)
    print_table(rows)
    bad = [r for r in rows if r.error or (r.speedup is not None and r.speedup < 1.0) or r.outputs_match is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
