"""The `forge` command line: argparse subcommands with thin handlers; heavy imports inside them.

Bad input (UserError) is printed as one line on stderr with exit code 2; a run that failed (RunFailed), as
one line with exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from forge.backends import BACKENDS, NAMES
from forge.errors import Interrupted, RunFailed, UserError

log = logging.getLogger("forge")

DB_HELP = "the run store: a SQLite path or SQLAlchemy URL (default: $FORGE_DB if set, else runs/forge.db)"
OUT_HELP = ("folder for the run's artifact, written to DIR/<run id>/ (default: $FORGE_OUT if set, else the folder "
            "of the SQLite store: runs/ for the default store, /x/ for --db /x/forge.db; a resumed run: where it "
            "started)")
WHERE = ("where things go: the store is --db, else $FORGE_DB, else runs/forge.db (relative to the current folder); "
         "a run's artifact is --out/<run id>/, else $FORGE_OUT/<run id>/, else next to the SQLite store. The review "
         "commands (runs, tree, show, report, ui) and --resume find the store the same way.")


# The numeric options' bounds, checked for whichever command has them, before it starts: what a value must be,
# and the words that say so. (The zoo's sizes are checked against each model: forge.capture.zoo.)
NUMBERS: dict[str, tuple[Callable[[float], bool], str]] = {
    "seconds": (lambda v: v > 0, "a number of seconds above 0"),
    "budget": (lambda v: v > 0, "a number above 0"),
    "timeout": (lambda v: v > 0, "a number of seconds above 0"),
    "max_usd": (lambda v: v > 0, "an amount above 0"),
    "workers": (lambda v: v >= 1, "at least 1"),
    "top": (lambda v: v >= 0, "0 for all, or more"),
    "limit": (lambda v: v >= 0, "0 for all, or more"),
    "port": (lambda v: 1 <= v <= 65535, "a TCP port, 1 to 65535"),
}


def check_numbers(args: argparse.Namespace) -> None:
    """Each numeric option given within its bounds (NUMBERS) and finite; else UserError naming it."""
    for name, (ok, words) in NUMBERS.items():
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise UserError(f"Invalid --{name.replace('_', '-')}: {value} ({words})")


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
    from forge.files import writable
    from forge.tasks.render import print_profile

    if args.json:
        writable(args.json)  # before the capture, which can take minutes
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


def cmd_export(args: argparse.Namespace) -> int:
    """forge export: a run's kernels as a kernel repository (forge.export.hf_kernels)."""
    from forge.export.hf_kernels import export
    from forge.review.data import find_run, open_store

    store = open_store(args.db)
    try:
        run = find_run(store, args.run)
    except KeyError as e:
        raise UserError(str(e.args[0])) from None
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
    if res.left_out:
        print(f"forge export: left out the scan kernels {', '.join(res.left_out)} (their reference calls the model's "
              "library through forge; a package needs torch alone)", file=sys.stderr)
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    """forge eval's arguments."""
    p = sub.add_parser("eval", help="build, verify and benchmark one kernel for one task")
    p.add_argument("kernel", help="kernel source: .c/.cpp (cpu), .cu (cuda), .py (triton; helion with --backend)")
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

    from forge.cli.optimize import add_optimize

    add_optimize(sub)

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
        check_numbers(args)
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"forge: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:  # stored with the run
        print(f"forge: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:  # a run that can be continued
        from forge.cli.optimize import resume_command

        print(f"forge: interrupted; what finished is stored; continue with: {resume_command(args, e.run_id)}",
              file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
