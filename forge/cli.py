"""The `forge` command line: argparse subcommands with thin handlers; heavy imports inside them.

Bad input (UserError) is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from forge.errors import UserError

log = logging.getLogger("forge")


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


def load_model(args: argparse.Namespace):  # noqa: ANN201 - returns forge.model_input.LoadedModel
    """The model named by the common options: a file or --zoo NAME."""
    from forge import model_input

    sizes = {"layers": args.layers, "batch": args.batch, "seq": args.seq, "resolution": args.resolution}
    if args.zoo and args.model:
        raise UserError("give either a model file or --zoo NAME, not both")
    if args.zoo:
        return model_input.load_zoo(args.zoo, args.device, args.dtype,
                                    **{k: v for k, v in sizes.items() if v is not None})
    if not args.model:
        raise UserError("no model given: pass a model file (e.g. examples/rmsnorm_swiglu.py) or --zoo NAME")
    given = [k for k, v in sizes.items() if v is not None]
    if given:
        raise UserError(f"--{given[0]} applies to --zoo models only; a model file sets its own sizes")
    return model_input.load_file(args.model, args.device, args.dtype)


def cmd_profile(args: argparse.Namespace) -> int:
    """forge profile: tasks by share of time."""
    from forge.profile import profile_model
    from forge.render import print_profile

    loaded = load_model(args)
    sizes = {k: getattr(args, k) for k in ("layers", "batch", "seq", "resolution") if getattr(args, k)}
    prof, _ = profile_model(loaded, budget_s=args.budget, extra={"sizes": sizes} if sizes else None)
    print_profile(prof, top=args.top)
    if args.json:
        prof.save(args.json)
        log.info("wrote %s", args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="forge", description="Make PyTorch models faster by searching "
                                     "for better GPU kernels.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="capture a model and list its tasks by share of time")
    _add_model_args(p)
    p.add_argument("--json", metavar="PATH", help="also write the profile as JSON")
    p.add_argument("--top", type=int, default=25, help="rows to show (0: all)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timed runs (after warm-up)")
    p.set_defaults(func=cmd_profile)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `forge` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"forge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
