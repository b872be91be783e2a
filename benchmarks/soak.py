"""Soak of the evaluation engine: many faulty candidates (every kind of the corpus) mixed with good ones.

Every file of tests/corpus/<backend>/ (crashes, hangs, illegal writes, cheats of every class, good
kernels) is a kind; candidates are drawn from the kinds at random (good ones weighted up, hangs down: each
costs the timeout), each made distinct by a comment with its number so that every one is really built.
All go through one Evaluator (one worker, restarted as crashes need) in batches, and every verdict is
stored in a real store (SQLite unless --db says otherwise). At the end the store is read back.

    python benchmarks/soak.py --n 1000 --json soak.json          # CPU corpus
    python benchmarks/soak.py --device cuda --backend cuda --n 1000   # on a GPU machine

Prints a table (kind, expected status, count, got as expected) and the totals: harness crashes (an
exception out of the Evaluator), verdicts stored against candidates sent, good candidates accepted.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import stamp  # noqa: E402

from forge.capture.export import capture  # noqa: E402
from forge.evaluate.evaluator import Evaluator  # noqa: E402
from forge.kernel import Candidate, TaskSpec  # noqa: E402
from forge.store import Store  # noqa: E402
from forge.store.recorder import evaluation_fields  # noqa: E402
from forge.tasks.cut import build_tasks  # noqa: E402

CORPUS = ROOT / "tests" / "corpus"
SUFFIX = {"cpu": ".cpp", "cuda": ".cu", "triton": ".py"}
WEIGHT = {"good": 8.0, "infinite_loop": 0.25, "torch_call": 0.5}  # others 1


def silu_task(device: str) -> TaskSpec:
    """The corpus's task: SiLU over float32 [257, 1000]."""
    x = torch.empty(257, 1000, device="meta")
    return TaskSpec.of(build_tasks(capture(torch.nn.SiLU(), [x]).graph_module.graph)[0])


def kinds(backend: str) -> dict[str, tuple[str, str]]:
    """kind -> (expected status, source)."""
    out = {}
    for p in sorted((CORPUS / backend).glob("*" + SUFFIX[backend])):
        text = p.read_text()
        out[p.stem] = (text.splitlines()[0].split("expect:")[1].strip(), text)
    return out


def draw(table: dict[str, tuple[str, str]], n: int, rng: random.Random) -> list[str]:
    names = list(table)
    return rng.choices(names, weights=[WEIGHT.get(k, 1.0) for k in names], k=n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="cpu", choices=sorted(SUFFIX))
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a candidate may run in the worker")
    p.add_argument("--seed", type=int, default=0, help="of the draw (the verification seeds stay secret)")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite path (default: a temporary SQLite file)")
    p.add_argument("--json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    table, rng = kinds(args.backend), random.Random(args.seed)
    order = draw(table, args.n, rng)
    task = silu_task(args.device)
    tmp = tempfile.mkdtemp(prefix="forge-soak-")
    store = Store(args.db or str(Path(tmp) / "soak.db"))
    run = store.create_run("soak", device=args.device, dtype="float32", policy="manual",
                           config={"command": "soak", "n": args.n, "seed": args.seed})
    t = store.add_task(run.id, task.key, family="activation", count=1, ms=0.0, share=1.0, source=task.source,
                       meta={})
    got: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    crashes, sent, start = [], 0, time.monotonic()
    with Evaluator(args.device, timeout_s=args.timeout, cache_dir=Path(tmp) / "cache") as ev:
        for b in range(0, args.n, args.batch):
            names = order[b:b + args.batch]
            mark = "#" if args.backend == "triton" else "//"
            cands = [Candidate(args.backend, table[k][1] + f"\n{mark} soak {b + i}\n") for i, k in enumerate(names)]
            sent += len(cands)
            try:
                results = list(ev.evaluate_many(task, cands))
            except Exception as e:  # noqa: BLE001 - what the soak counts: the harness itself failing
                crashes.append(f"batch {b}: {type(e).__name__}: {e}"[:300])
                continue
            for k, c, r in zip(names, cands, results, strict=True):
                got[k][r.status.value] += 1
                row = store.add_candidate(t.id, None, backend=c.backend, source=c.source, entry=c.entry,
                                          origin="manual", status=r.status.value)
                store.add_evaluation(row.id, **evaluation_fields(r))
            print(f"{b + len(names)}/{args.n} candidates, {time.monotonic() - start:.0f} s", flush=True)
    store.update_run(run.id, state="done")
    stored = store.candidates(t.id)
    verdicts = sum(len(store.evaluations(c.id)) for c in stored)
    rows = []
    for k in sorted(got):
        want = table[k][0]
        rows.append({"kind": k, "expected": want, "count": sum(got[k].values()), "as_expected": got[k][want],
                     "got": dict(got[k])})
    good = next((r for r in rows if r["kind"] == "good"), {"count": 0, "as_expected": 0})
    summary = {"candidates": args.n, "sent": sent, "harness_crashes": len(crashes), "crashes": crashes,
               "stored_candidates": len(stored), "stored_verdicts": verdicts, "good": good["count"],
               "good_accepted": good["as_expected"], "wall_s": time.monotonic() - start,
               "all_as_expected": all(r["as_expected"] == r["count"] for r in rows), **stamp(args.device)}
    print("\n| kind | expected | count | as expected | got |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['expected']} | {r['count']} | {r['as_expected']} | "
              f"{', '.join(f'{s} {n}' for s, n in r['got'].items())} |")
    print(f"\n{summary['candidates']} candidates in {summary['wall_s']:.0f} s: {summary['harness_crashes']} harness "
          f"crashes, {summary['stored_verdicts']} verdicts stored for {summary['stored_candidates']} candidates, "
          f"{summary['good_accepted']} of {summary['good']} good ones accepted, every kind as expected: "
          f"{summary['all_as_expected']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "kinds": rows}, indent=1) + "\n")
    return 0 if not crashes and summary["all_as_expected"] and verdicts == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
