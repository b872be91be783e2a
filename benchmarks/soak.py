"""Soak of the evaluation engine: many faulty candidates (every kind of the corpus) mixed with good ones.

Every file of tests/corpus/<backend>/ (crashes, hangs, illegal writes, cheats of every class, good
kernels) is a kind; candidates are drawn from the kinds at random (good ones weighted up, hangs down: each
costs the timeout), each made distinct by a comment with its number so that every one is really built.
All go through one Evaluator (one worker, restarted as crashes need) in batches, and every verdict is
stored in a real store (SQLite unless --db says otherwise). At the end the store is read back.

    python benchmarks/soak.py --n 1000 --json soak.json          # CPU corpus
    python benchmarks/soak.py --device cuda --backend cuda --n 1000   # on a GPU machine
    python benchmarks/soak.py ... --db soak.db --seconds 500     # in parts: the same command goes on

With `--db` and `--seconds`, a soak stops starting batches after that many seconds (exit 3) and the same
command on the same database goes on where it stopped (a device call has a time limit; 1000 CUDA candidates,
with their crashes' worker restarts and hangs' timeouts, take longer). The table is read from the store, so it
covers every part.

Prints a table (kind, expected status, count, got as expected) and the totals: harness crashes (an
exception out of the Evaluator), verdicts stored against candidates sent, good candidates accepted.
Exit 0 when all are as expected, 1 when not, 3 when stopped by `--seconds` before the end.
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


def open_run(store: Store, args: argparse.Namespace, task: TaskSpec) -> tuple[str, int]:
    """The soak's run and task in the store: the unfinished one of the same command, or a new one."""
    config = {"command": "soak", "n": args.n, "seed": args.seed, "backend": args.backend, "batch": args.batch,
              "timeout": args.timeout}
    run = next((r for r in store.list_runs(state="running") if r.model == "soak" and r.device == args.device
                and {k: r.config.get(k) for k in config} == config), None)
    if run is not None:
        print(f"going on with {run.id}: {run.config.get('next', 0)} of {args.n} sent before", flush=True)
    else:
        run = store.create_run("soak", device=args.device, dtype="float32", policy="manual",
                               config={**config, "next": 0, "crashes": [], "wall_s": 0.0})
    tasks = store.get_tasks(run.id)  # none when a kill came between the two
    t = tasks[0] if tasks else store.add_task(run.id, task.key, family="activation", count=1, ms=0.0, share=1.0,
                                              source=task.source, meta={})
    return run.id, t.id


def soak(store: Store, run_id: str, task_id: int, task: TaskSpec, args: argparse.Namespace,
         table: dict[str, tuple[str, str]], order: list[str], cache: Path) -> bool:
    """Send the batches not sent yet; True when all were, False when `--seconds` stopped it first."""
    start = time.monotonic()
    config = dict(store.get_run(run_id).config)
    before = config["wall_s"]  # of the parts before this one
    mark = "#" if args.backend == "triton" else "//"
    with Evaluator(args.device, timeout_s=args.timeout, cache_dir=cache) as ev:
        for b in range(config["next"], args.n, args.batch):
            if args.seconds and time.monotonic() - start > args.seconds:
                return False
            names = order[b:b + args.batch]
            cands = [Candidate(args.backend, table[k][1] + f"\n{mark} soak {b + i}\n") for i, k in enumerate(names)]
            try:
                results = list(ev.evaluate_many(task, cands))
            except Exception as e:  # noqa: BLE001 - what the soak counts: the harness itself failing
                config["crashes"] = [*config["crashes"], f"batch {b}: {type(e).__name__}: {e}"[:300]]
                results = []
            for i, (k, c, r) in enumerate(zip(names, cands, results, strict=False)):
                row = store.add_candidate(task_id, None, backend=c.backend, source=c.source, entry=c.entry,
                                          knobs={"soak": b + i, "kind": k}, origin="manual", status=r.status.value)
                store.add_evaluation(row.id, **evaluation_fields(r))
            config = {**config, "next": b + len(names), "wall_s": before + time.monotonic() - start}
            store.update_run(run_id, config=config)
            print(f"{b + len(names)}/{args.n} candidates, {config['wall_s']:.0f} s", flush=True)
    return True


def summary(store: Store, run_id: str, task_id: int, table: dict[str, tuple[str, str]],
            args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """The totals and the per-kind rows, read back from the store (every part of the soak)."""
    config = store.get_run(run_id).config
    got: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    # by number, the last stored: a part killed after storing some of a batch but before saying so sent
    # that batch again when the next part began
    stored = {c.knobs["soak"]: c for c in store.candidates(task_id)}
    verdicts = 0
    for c in stored.values():
        evaluations = store.evaluations(c.id)
        verdicts += len(evaluations) > 0
        got[c.knobs["kind"]][evaluations[-1].status if evaluations else "none"] += 1
    rows = [{"kind": k, "expected": table[k][0], "count": sum(got[k].values()), "as_expected": got[k][table[k][0]],
             "got": dict(got[k])} for k in sorted(got)]
    good = next((r for r in rows if r["kind"] == "good"), {"count": 0, "as_expected": 0})
    return {"candidates": args.n, "sent": config["next"], "harness_crashes": len(config["crashes"]),
            "crashes": config["crashes"], "stored_candidates": len(stored), "stored_verdicts": verdicts,
            "good": good["count"], "good_accepted": good["as_expected"], "wall_s": config["wall_s"],
            "all_as_expected": all(r["as_expected"] == r["count"] for r in rows), **stamp(args.device)}, rows


def report(total: dict, rows: list[dict]) -> None:
    print("\n| kind | expected | count | as expected | got |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['expected']} | {r['count']} | {r['as_expected']} | "
              f"{', '.join(f'{s} {n}' for s, n in r['got'].items())} |")
    print(f"\n{total['sent']} of {total['candidates']} candidates sent in {total['wall_s']:.0f} s: "
          f"{total['harness_crashes']} harness crashes, {total['stored_verdicts']} verdicts stored for "
          f"{total['stored_candidates']} candidates, {total['good_accepted']} of {total['good']} good ones "
          f"accepted, every kind as expected: {total['all_as_expected']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="cpu", choices=sorted(SUFFIX))
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a candidate may run in the worker")
    p.add_argument("--seed", type=int, default=0, help="of the draw (the verification seeds stay secret)")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite path (default: a temporary SQLite file)")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="start no batch after this many seconds (exit 3); the same command with --db goes on")
    p.add_argument("--json")
    args = p.parse_args()
    if args.seconds and not args.db:
        p.error("--seconds needs --db: a soak in parts goes on in the database it was stored in")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    table = kinds(args.backend)
    order = draw(table, args.n, random.Random(args.seed))
    task = silu_task(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="forge-soak-"))
    store = Store(args.db or str(tmp / "soak.db"))
    run_id, task_id = open_run(store, args, task)
    finished = soak(store, run_id, task_id, task, args, table, order, tmp / "cache")
    total, rows = summary(store, run_id, task_id, table, args)
    report(total, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": total, "kinds": rows}, indent=1) + "\n")
    if not finished:
        print(f"stopped after --seconds {args.seconds:g}: run the same command on the same --db to go on")
        return 3
    store.update_run(run_id, state="done")
    ok = not total["crashes"] and total["all_as_expected"] and total["stored_verdicts"] == args.n
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
