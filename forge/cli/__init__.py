"""The `forge` command line: argparse subcommands with thin handlers; heavy imports inside them.

Bad input (UserError) is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from forge.backends import BACKENDS, NAMES
from forge.errors import Interrupted, UserError

if TYPE_CHECKING:
    from forge.evaluate.pool import Scale
    from forge.policy.base import Policy
    from forge.store import Store

log = logging.getLogger("forge")

DB_HELP = "the run store: a SQLite path or SQLAlchemy URL (default: $FORGE_DB if set, else runs/forge.db)"
OUT_HELP = ("folder for the run's artifact, written to DIR/<run id>/ (default: $FORGE_OUT if set, else the folder "
            "of the SQLite store: runs/ for the default store, /x/ for --db /x/forge.db; a resumed run: where it "
            "started)")
WHERE = ("where things go: the store is --db, else $FORGE_DB, else runs/forge.db (relative to the current folder); "
         "a run's artifact is --out/<run id>/, else $FORGE_OUT/<run id>/, else next to the SQLite store. The review "
         "commands (runs, tree, show, report, ui) and --resume find the store the same way.")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="a model file (KernelBench convention: Model, get_inputs, "
                   "get_init_inputs)")
    p.add_argument("--zoo", metavar="NAME", help="a reference model: resnet50, sd35-mmdit, "
                   "sd35-vae-decoder, gemma4, qwen35")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | meta (shapes only, no timing)")
    p.add_argument("--dtype", default="fp32", help="fp32 | bf16 | fp16")
    p.add_argument("--layers", type=int, help="zoo: number of decoder layers / transformer blocks")
    p.add_argument("--batch", type=int, help="zoo: batch size")
    p.add_argument("--seq", type=int, help="zoo: sequence length (language models, MMDiT text)")
    p.add_argument("--resolution", type=int, help="zoo: image resolution in pixels")
    _add_mode_arg(p)


def _add_mode_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval", action="store_true", help="put a model file's Model in inference mode (model.eval()) "
                   "first; without it the model runs as constructed, in training mode unless it sets otherwise "
                   "(BatchNorm on the batch's statistics, as KernelBench runs it); --zoo models are always eval")


def load_model(args: argparse.Namespace):  # noqa: ANN201 - returns forge.capture.model_input.LoadedModel
    """The model named by the common options: a file or --zoo NAME."""
    from forge.capture import model_input

    sizes = {"layers": args.layers, "batch": args.batch, "seq": args.seq, "resolution": args.resolution}
    if args.zoo and getattr(args, "model", None):
        raise UserError("give either a model file or --zoo NAME, not both")
    if args.zoo:
        return model_input.load_zoo(args.zoo, args.device, args.dtype,
                                    **{k: v for k, v in sizes.items() if v is not None})
    if not args.model:
        raise UserError("no model given: pass a model file (e.g. examples/rmsnorm_swiglu.py) or --zoo NAME")
    given = [k for k, v in sizes.items() if v is not None]
    if given:
        raise UserError(f"--{given[0]} applies to --zoo models only; a model file sets its own sizes")
    return model_input.load_file(args.model, args.device, args.dtype, eval=bool(getattr(args, "eval", False)))


def _blocks(args: argparse.Namespace) -> bool:
    """--blocks as given, else the zoo model's default (forge.capture.zoo.ZooSpec.blocks)."""
    if args.blocks is not None:
        return bool(args.blocks)
    from forge.capture import zoo

    return bool(args.zoo) and zoo.get_spec(args.zoo).blocks


def cmd_profile(args: argparse.Namespace) -> int:
    """forge profile: tasks by share of time."""
    from forge.capture.profile import profile_blockwise, profile_model
    from forge.tasks.render import print_profile

    loaded = load_model(args)
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    extra = {"sizes": sizes} if sizes else None
    # a model of repeated blocks captured one distinct block at a time (where it applies; else whole)
    prof = profile_blockwise(loaded, extra, budget_s=args.budget) if _blocks(args) else None
    if prof is None:
        prof, _ = profile_model(loaded, budget_s=args.budget, extra=extra)
    print_profile(prof, top=args.top)
    if args.json:
        prof.save(args.json)
        log.info("wrote %s", args.json)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """forge eval: one candidate through build, verification and timing; exit 0 if it passes, 1 if not."""
    from forge.capture.model_input import check_device
    from forge.capture.profile import Profile, profile_model
    from forge.evaluate.evaluator import Evaluator
    from forge.kernel import Candidate, TaskSpec
    from forge.tasks.render import print_eval

    path = Path(args.kernel)
    if not path.is_file():
        raise UserError(f"kernel file not found: {path}")
    try:
        cand = Candidate.from_file(path, args.backend)
    except ValueError as e:
        raise UserError(str(e)) from e
    device = check_device(args.device)
    if args.profile:
        if args.model or args.zoo:
            raise UserError("give either --profile or a model (--model / --zoo), not both")
        try:
            prof = Profile.load(args.profile)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read profile {args.profile}: {e}") from e
    else:
        args.device = "meta"  # the task list needs shapes only
        prof, _ = profile_model(load_model(args))
    matches = [t for t in prof.tasks if t.key == args.task] or [t for t in prof.tasks if t.key.startswith(args.task)]
    if len(matches) != 1:
        some = ", ".join(t.key for t in prof.tasks[:8])
        what = "no task" if not matches else f"{len(matches)} tasks"
        raise UserError(f"{what} matching --task {args.task!r} in {prof.model} (tasks: {some}, ...)")
    task = matches[0]
    if (BACKENDS[cand.backend].device == "cpu") != (device == "cpu"):
        raise UserError(f"a {cand.backend} kernel cannot run on --device {device}")
    with Evaluator(device, timeout_s=args.timeout) as ev:
        res = ev.evaluate(TaskSpec.of(task), cand)
    print_eval(task, cand, res)
    if not args.no_store:
        from forge.store import Store
        from forge.store.recorder import StoreRecorder

        store = Store(args.db)
        run = store.create_run(prof.model, device=device, dtype=prof.dtype, policy="manual",
                               config={"command": "eval", "kernel": str(path)})
        rec = StoreRecorder(store, run.id)  # the rows a search writes for one evaluated node
        rec.evaluated(rec.add_task(task).id, None, cand, {}, "manual", res, None)
        store.update_run(run.id, state="done")
        log.info("stored as run %s in %s", run.id, store.where)
    return 0 if res.status.passed else 1


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
    from forge.job import optimize
    from forge.search.driver import Budget
    from forge.store import Store
    from forge.tasks.render import print_optimize

    if _isolated_from_keys(args):
        return _run_isolated(args)
    store = Store(args.db)
    if args.resume:  # the run's own model (unless one is given: it must match), device, dtype and budget
        from forge.job import resumable

        run = resumable(store, args.resume)
        load = run.config.get("load", {})
        if not args.model and not args.zoo:
            args.model, args.zoo = load.get("file"), load.get("zoo")
            for k, v in load.get("sizes", {}).items():
                setattr(args, k, v)
            if not args.model and not args.zoo:
                raise UserError(f"run {run.id} does not say how its model was loaded: give the model ({run.model})")
        args.device, args.dtype, args.policy = run.device, run.dtype, run.policy
        args.eval = run.config.get("mode", "eval") == "eval"  # the run's mode (runs stored before it was: eval)
    scale = _scale(args)
    loaded = load_model(args)
    pol = _policy(args, store, loaded.device)
    budget = Budget(candidates=args.budget, seconds=args.seconds, per_task=max(4, min(args.budget, 16)))
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
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """forge export: a run's kernels as a kernel repository (forge.export.hf_kernels)."""
    from forge.export.hf_kernels import export
    from forge.review.data import find_run, open_store

    try:
        store = open_store(args.db)
        run = find_run(store, args.run)
    except (FileNotFoundError, KeyError) as e:
        raise UserError(str(e.args[0] if isinstance(e, KeyError) else e)) from None
    load = run.config.get("load", {})
    ns = argparse.Namespace(model=load.get("file"), zoo=load.get("zoo"), device=run.device, dtype=run.dtype,
                            eval=run.config.get("mode", "eval") == "eval",
                            **{k: load.get("sizes", {}).get(k) for k in ("layers", "batch", "seq", "resolution")})
    if not ns.model and not ns.zoo:
        raise UserError(f"run {run.id} does not say how its model was loaded (it was not run by forge optimize)")
    loaded = load_model(ns)
    res = export(store, run.id, loaded.model, loaded.inputs, args.dir, name=args.name)
    from forge import terminal

    terminal.console().print(f"exported {len(res.kernels)} kernels of run {run.id} to {res.folder} "
                             f"({', '.join(res.variants)}); layers: {', '.join(res.layers) or 'none'}")
    return 0


def _scale(args: argparse.Namespace) -> Scale:
    """Where candidates are judged (--gpus, --workers, --ray), checked before the model loads."""
    from forge.evaluate.pool import Scale

    cuda = args.device.startswith("cuda")
    if args.workers is not None and (args.workers < 1 or cuda):
        raise UserError(f"Invalid --workers: {args.workers} (CPU workers, at least 1; on CUDA: --gpus)")
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

    name = args.policy
    if args.resume:
        from forge.job import resumable
        from forge.store import Store

        name = resumable(Store(args.db), args.resume).policy
    from forge.job import RECIPE_POLICIES

    llm = name not in (*RECIPE_POLICIES, "") and not args.replay
    if name in RECIPE_POLICIES and not args.replay and (args.max_usd is not None or args.prices):
        raise UserError("--max-usd, --replay and --prices apply to LLM policies (e.g. --policy openai:MODEL)")
    chat = keyholder_chat(name, max_usd=args.max_usd, prices=args.prices) if llm else None
    return broker.run_isolated(args.argv, chat)


def resume_command(args: argparse.Namespace, run_id: str) -> str:
    """The command that continues run `run_id` as it was started: --resume with the options the run does not
    store (--db, --no-inductor, the LLM's --max-usd, --prices and --replay, --json, -v); model, device, dtype,
    policy, budget, layout and blocks come from the run."""
    words = ["forge", "optimize", "--resume", run_id, *shlex.split(_db_flag(getattr(args, "db", None)))]
    for opt in ("max_usd", "prices", "replay", "json"):
        if getattr(args, opt, None) is not None:
            words += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    if not getattr(args, "inductor", True):
        words.append("--no-inductor")
    if getattr(args, "verbose", False):
        words.append("-v")
    return shlex.join(words)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    """forge eval's arguments."""
    p = sub.add_parser("eval", help="build, verify and benchmark one kernel for one task")
    p.add_argument("kernel", help="kernel source: .c/.cpp (cpu), .cu (cuda) or .py (triton)")
    p.add_argument("--task", required=True, help="the task's key (or a unique prefix of it)")
    p.add_argument("--model", help="the model file the task comes from")
    p.add_argument("--zoo", metavar="NAME", help="or a reference model")
    p.add_argument("--profile", metavar="JSON", help="or a profile written by forge profile --json")
    p.add_argument("--device", default="cpu", help="where to verify and time: cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="fp32", help="the model's dtype (with --model / --zoo)")
    p.add_argument("--backend", choices=NAMES, help="default: from the file suffix")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a hung candidate is killed")
    p.add_argument("--db", help=DB_HELP)
    p.add_argument("--no-store", action="store_true", help="do not record the evaluation")
    for name in ("layers", "batch", "seq", "resolution"):
        p.add_argument(f"--{name}", type=int, help=f"zoo: {name}")
    _add_mode_arg(p)
    p.set_defaults(func=cmd_eval)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="forge", description="Make PyTorch models faster by searching "
                                     "for better GPU kernels.", epilog=WHERE)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="capture a model and list its tasks by share of time")
    _add_model_args(p)
    p.add_argument("--json", metavar="PATH", help="also write the profile as JSON")
    p.add_argument("--top", type=int, default=25, help="rows to show (0: all)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timed runs (after warm-up; with "
                   "--blocks: for the glue and for each distinct block)")
    p.add_argument("--blocks", action=argparse.BooleanOptionalAction, help="each distinct repeated block "
                   "captured and timed once (faster on deep models; regions stop at block boundaries; default: "
                   "on for --zoo qwen35)")
    p.set_defaults(func=cmd_profile)

    _add_eval(sub)

    p = sub.add_parser("optimize", help="search faster kernels for a model and measure it end to end", epilog=WHERE)
    _add_model_args(p)
    p.add_argument("--policy", default="recipes", help="recipes (offline code generator; the default), "
                   "recipes+triton (its Triton kernels too, on a GPU), openai:MODEL, anthropic:MODEL, "
                   "openai-compatible:BASE_URL:MODEL, or recipes+ before an LLM policy to mix them (docs/llm.md)")
    p.add_argument("--max-usd", type=float, help="LLM budget in US dollars: the search stops when it is spent")
    p.add_argument("--replay", metavar="RUN", help="answer every LLM request from run RUN's stored calls only "
                   "(no network, no key)")
    p.add_argument("--prices", metavar="JSON", help="LLM prices overriding forge/policy/llm/prices.json")
    p.add_argument("--budget", type=int, default=400, help="candidates over all tasks, at most (default 400: a cap; "
                   "--seconds is what ends a run)")
    p.add_argument("--seconds", type=float, default=300.0, help="wall time of the whole run: capture, search, "
                   "rewrites and the final timing; the first Inductor compilation starts even when it is spent, so "
                   "that the result is never behind torch.compile for want of time (default 300)")
    p.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure the result compiled by torch.compile and keep it when faster (default on)")
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

    p = sub.add_parser("export", help="write a run's kernels as a Hugging Face kernel repository")
    p.add_argument("run", metavar="RUN", help="a run id (or unique prefix, or last)")
    p.add_argument("dir", metavar="DIR", help="the new repository's folder (must not exist or be empty)")
    p.add_argument("--format", choices=["hf-kernels"], default="hf-kernels", help="the repository's layout")
    p.add_argument("--name", help="the kernel's name (default: forge-<run id>)")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=cmd_export)

    from forge.review.commands import register  # runs, tree, show, report, ui

    register(sub, DB_HELP, WHERE)
    from forge.lab.commands import register as register_lab

    register_lab(sub, DB_HELP)
    for p in sub.choices.values():  # the global options after the subcommand too; each command's defaults shown
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress")
        p.formatter_class = _Help
    return parser


class _Help(argparse.HelpFormatter):
    """Help that shows an option's default where its text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _db_flag(db: str | None) -> str:
    """` --db STORE` that finds the store from any folder (the SQLite file's absolute path), or "" where $FORGE_DB
    named a database server (the environment still does)."""
    from forge.store import resolve_url, sqlite_file

    file = sqlite_file(resolve_url(db, create=False))
    if file is not None:
        return f" --db {shlex.quote(str(file))}"
    return f" --db {shlex.quote(db)}" if db else ""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"forge {version('forge-kernels')}"
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "forge (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `forge` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # forge optimize may run itself again, keyless
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"forge: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # a run that can be continued
        print(f"forge: interrupted; what finished is stored; continue with: {resume_command(args, e.run_id)}",
              file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
