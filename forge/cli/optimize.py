"""`forge optimize`'s handler: the policy (LLM options checked before any search), where candidates are judged,
the job run in a child without credentials when an LLM key is needed, and the command that resumes a run."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from forge.cli import DB_HELP, OUT_HELP, WHERE, _add_model_args, _blocks, load_model
from forge.errors import UserError
from forge.files import folder, writable, write

if TYPE_CHECKING:
    from forge.evaluate.pool import Scale
    from forge.policy.base import Policy
    from forge.search.driver import Budget
    from forge.store import RunRecord, Store

BUDGET, SECONDS = 400, 300.0  # --budget and --seconds when not given (a replay or a resume: the run's own)


def add_optimize(sub: argparse._SubParsersAction) -> None:
    """forge optimize's arguments."""
    p = sub.add_parser("optimize", help="search faster kernels for a model and measure it end to end", epilog=WHERE)
    _add_model_args(p)
    p.add_argument("--policy", default="recipes", help="recipes (offline code generator; the default), "
                   "recipes+triton or recipes+helion (its Triton or Helion kernels too, on a GPU), openai:MODEL, "
                   "anthropic:MODEL, openai-compatible:BASE_URL:MODEL, or recipes+ before an "
                   "LLM policy to mix them (docs/llm.md)")
    p.add_argument("--max-usd", type=float, help="LLM budget in US dollars: the search stops when it is spent")
    p.add_argument("--replay", metavar="RUN", help="answer every LLM request from run RUN's stored calls only "
                   "(no network, no key); alone, RUN's model, device, dtype, mode, policy, layout, blocks, "
                   "--inductor and budget (--budget, --seconds override them)")
    p.add_argument("--prices", metavar="JSON", help="LLM prices overriding forge/policy/llm/prices.json")
    p.add_argument("--budget", type=int, help="candidates over all tasks, at most (default 400: a cap; "
                   "--seconds is what ends a run)")
    p.add_argument("--seconds", type=float, help="wall time of the whole run: capture, search, "
                   "rewrites and the final timing; the first Inductor compilation starts even when it is spent, so "
                   "that the result is never behind torch.compile for want of time (default 300)")
    p.add_argument("--inductor", action=argparse.BooleanOptionalAction,
                   help="also measure the result compiled by torch.compile and keep it when faster (default on; "
                   "--resume and --replay: as the run did)")
    p.add_argument("--layout", choices=("auto", "row-major", "channels-last"), default="auto",  # layout.CHOICES
                   help="activation layout the model is captured and searched in (default auto: channels-last "
                   "when the model has convolutions and its forward is faster so, measured)")
    p.add_argument("--blocks", action=argparse.BooleanOptionalAction, help="capture each distinct repeated "
                   "block once and apply the kernels block by block (deep models; no whole-graph rewrites; "
                   "default: on for --zoo qwen35)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--out", metavar="DIR", help=OUT_HELP)
    p.add_argument("--resume", metavar="RUN", help="continue a stopped or killed run (its id) with its own "
                   "model, device, budget and stored candidates; none is evaluated again")
    p.add_argument("--gpus", metavar="N|all", help="evaluation workers on this host's GPUs, one per GPU "
                   "(cuda:0..N-1; default 1: the --device)")
    p.add_argument("--workers", type=int, metavar="N", help="CPU evaluation workers (--device cpu; with --ray: "
                   "Ray actors; default 1, with --ray half the cluster's CPUs)")
    p.add_argument("--ray", metavar="ADDRESS", help="judge on a Ray cluster (auto: the one this host is part "
                   "of; local: one started here): builds as Ray tasks, one actor per GPU of the cluster (pip install "
                   "'forge-kernels[ray]')")
    p.set_defaults(func=cmd_optimize)


def _policy(args: argparse.Namespace, store: Store, device: str) -> Policy:
    """--policy with --max-usd, --replay and --prices; the key is checked here, before any search."""
    from forge.job import RECIPE_POLICIES, make_policy

    if args.replay and args.policy == "recipes":  # replay the run's own LLM policy
        try:
            args.policy = store.get_run(args.replay).policy
        except KeyError:
            raise UserError(f"no run {args.replay!r} to replay in the store {store.where} (--db PATH|URL or "
                            "FORGE_DB=PATH|URL points at another store)") from None
    if args.policy in RECIPE_POLICIES:
        if args.max_usd is not None or args.replay or args.prices:
            raise UserError("--max-usd, --replay and --prices apply to LLM policies (e.g. --policy openai:MODEL)")
        return make_policy(args.policy, device)
    return make_policy(args.policy, device, store=store, max_usd=args.max_usd, replay=args.replay,
                       prices=args.prices)


def cmd_optimize(args: argparse.Namespace) -> int:
    """forge optimize: search kernels for every task and measure the model end to end."""
    import json

    from rich.text import Text

    from forge import terminal
    from forge.capture import layout
    from forge.job import artifacts_root, optimize
    from forge.review.data import open_store
    from forge.search.driver import Budget
    from forge.store import Store
    from forge.tasks.render import print_optimize

    _check_first(args)
    if _isolated_from_keys(args):
        return _run_isolated(args)
    store = open_store(args.db) if args.resume else Store(args.db)  # a resumed one must be there
    if args.out or not args.resume:  # a resumed run keeps the folder it started with
        folder(artifacts_root(store, args.out))  # now, not when the run's artifact is written
    budget = None
    if args.resume:  # the run's own model (unless one is given: it must match), device, dtype and budget
        from forge.job import resumable

        run = resumable(store, args.resume)
        if not args.model and not args.zoo:
            _model_of(args, run)
        args.device, args.dtype, args.policy = run.device, run.dtype, run.policy
        args.eval = run.config.get("mode", "eval") == "eval"  # the run's mode (runs stored before it was: eval)
        _inductor_of(args, run)
    elif args.replay and not args.model and not args.zoo:
        budget = _replayed(args, store)
    args.inductor = args.inductor is not False
    scale = _scale(args)
    loaded = load_model(args)
    pol = _policy(args, store, loaded.device)
    if budget is None:
        candidates = args.budget if args.budget is not None else BUDGET
        budget = Budget(candidates=candidates, seconds=args.seconds if args.seconds is not None else SECONDS,
                        per_task=max(4, min(candidates, 16)))
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k) is not None}
    load = {"file": str(Path(args.model).resolve()) if args.model else None, "zoo": args.zoo, "sizes": sizes}
    with terminal.RunProgress(terminal.console(stderr=True)) as shown:  # live on a terminal, lines when piped
        report = optimize(loaded, store, policy=pol, budget=budget, progress=shown, resume=args.resume, load=load,
                          inductor=args.inductor, layout=layout.requested(args.layout), blocks=_blocks(args),
                          runs_dir=args.out, scale=scale)
    print_optimize(report)
    out = terminal.console()  # folds at a terminal's width; piped, one line each
    out.print(Text(f"run {report.run_id} stored in {store.where}"), overflow="fold")
    out.print(Text(f"review it with: forge report {report.run_id}{_db_flag(args.db)}"), overflow="fold")
    if args.json:
        write(args.json, json.dumps(report.to_json(), indent=1) + "\n")
    return 0


def _check_first(args: argparse.Namespace) -> None:
    """What can be refused before the store is opened (or made) and anything runs: --device meta, a model file
    that is not there, a --json that cannot be written (not found out after the run), an LLM policy's name that
    does not parse or whose key is not set."""
    if args.device == "meta":
        raise UserError("--device meta captures shapes and times nothing: forge optimize needs cpu or cuda "
                        "(forge profile --device meta lists the tasks)")
    if args.model:
        from forge.capture.model_input import check_file

        check_file(args.model)
    if args.json:
        writable(args.json)
    from forge.job import RECIPE_POLICIES

    if args.policy not in RECIPE_POLICIES and not args.resume and not args.replay:  # those take the run's own
        from forge.policy.llm import check_name

        check_name(args.policy)


def _model_of(args: argparse.Namespace, run: RunRecord) -> None:
    """The stored run's model, as it was loaded (a file or a zoo model and its sizes), into `args`."""
    load = run.config.get("load", {})
    args.model, args.zoo = load.get("file"), load.get("zoo")
    for k, v in load.get("sizes", {}).items():
        setattr(args, k, v)
    if not args.model and not args.zoo:
        raise UserError(f"run {run.id} does not say how its model was loaded: give the model ({run.model})")


def _replayed(args: argparse.Namespace, store: Store) -> Budget:
    """`--replay RUN` alone: RUN's model, device, dtype, mode, policy, layout, blocks and --inductor into `args`,
    and its budget (--budget and --seconds, when given, override it); UserError when RUN cannot be replayed."""
    from dataclasses import replace

    from forge.job import RECIPE_POLICIES
    from forge.search.driver import Budget

    try:
        run = store.get_run(args.replay)
    except KeyError:
        raise UserError(f"no run {args.replay!r} to replay in the store {store.where} (--db PATH|URL or "
                        "FORGE_DB=PATH|URL points at another store)") from None
    if "budget" not in run.config:
        raise UserError(f"run {run.id} was not made by forge optimize ({run.policy or 'no policy'}): only optimize "
                        "runs replay")
    if run.policy in RECIPE_POLICIES:
        raise UserError(f"run {run.id} searched with --policy {run.policy}: it made no LLM calls to replay")
    _model_of(args, run)
    args.device, args.dtype, args.policy = run.device, run.dtype, run.policy
    args.eval = run.config.get("mode", "eval") == "eval"
    layout = run.config.get("layout")  # as captured: "" is the model's own (row-major)
    args.layout = "auto" if layout is None else layout or "row-major"
    if args.blocks is None:
        args.blocks = bool(run.config.get("blocks"))
    _inductor_of(args, run)
    budget = Budget(**run.config["budget"])
    if args.budget is not None:
        budget = replace(budget, candidates=args.budget)
    return budget if args.seconds is None else replace(budget, seconds=args.seconds)


def _inductor_of(args: argparse.Namespace, run: RunRecord) -> None:
    """--inductor as `run` measured (unless given): runs stored before it was recorded had it on."""
    if args.inductor is None:
        args.inductor = bool(run.config.get("inductor", True))


def _scale(args: argparse.Namespace) -> Scale:
    """Where candidates are judged (--gpus, --workers, --ray), checked before the model loads."""
    from forge.evaluate.pool import Scale

    cuda = args.device.startswith("cuda")
    if args.workers is not None and cuda:  # at least 1: forge.cli.NUMBERS
        raise UserError(f"Invalid --workers: {args.workers} (CPU workers; on CUDA: --gpus)")
    if args.gpus is not None and (not cuda or args.ray):
        raise UserError("--gpus needs --device cuda, and no --ray (on a cluster every GPU judges)")
    if args.gpus is None:
        return Scale(args.workers or 1, args.ray)
    import torch

    try:
        return Scale(Scale.parse_gpus(args.gpus, torch.cuda.device_count()))
    except ValueError as e:
        raise UserError(str(e)) from None

def _isolated_from_keys(args: argparse.Namespace) -> bool:
    """True when this optimize must run in a child without credentials (forge.policy.llm.broker)."""
    from forge.policy.llm import broker

    return broker.needs_isolation() and getattr(args, "argv", None) is not None


def _run_isolated(args: argparse.Namespace) -> int:
    """The job in a child without credentials; this process holds the LLM key (if the policy needs one) and
    sends the child's requests: the process that loads kernels holds no secret."""
    from forge.policy.llm import broker, keyholder_chat

    name, seconds = args.policy, args.seconds if args.seconds is not None else SECONDS
    if args.resume:
        from forge.job import resumable
        from forge.review.data import open_store

        run = resumable(open_store(args.db), args.resume)
        name, seconds = run.policy, run.config["budget"].get("seconds", seconds)
    from forge.job import RECIPE_POLICIES

    llm = name not in (*RECIPE_POLICIES, "") and not args.replay
    if name in RECIPE_POLICIES and not args.replay and (args.max_usd is not None or args.prices):
        raise UserError("--max-usd, --replay and --prices apply to LLM policies (e.g. --policy openai:MODEL)")
    chat = keyholder_chat(name, max_usd=args.max_usd, prices=args.prices) if llm else None
    return broker.run_isolated(args.argv, chat, seconds)  # no request outlasts the run's --seconds


def resume_command(args: argparse.Namespace, run_id: str) -> str:
    """The command that continues run `run_id` as it was started: --resume with the options the run does not
    store (--db, --no-inductor, the LLM's --max-usd, --prices and --replay, --json, -v); model, device, dtype,
    policy, budget, layout and blocks come from the run."""
    words = ["forge", "optimize", "--resume", run_id, *shlex.split(_db_flag(getattr(args, "db", None)))]
    for opt in ("max_usd", "prices", "replay", "json"):
        if getattr(args, opt, None) is not None:
            words += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    if getattr(args, "inductor", True) is False:
        words.append("--no-inductor")
    if getattr(args, "verbose", False):
        words.append("-v")
    return shlex.join(words)


def _db_flag(db: str | None) -> str:
    """` --db STORE` that finds the store from any folder (the SQLite file's absolute path), or "" where $FORGE_DB
    named a database server (the environment still does)."""
    from forge.store import resolve_url, sqlite_file

    file = sqlite_file(resolve_url(db, create=False))
    if file is not None:
        return f" --db {shlex.quote(str(file))}"
    return f" --db {shlex.quote(db)}" if db else ""
