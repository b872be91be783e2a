"""`forge lab`: serve the gallery, or (`--build`) build every entry's kernel into the cache first."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from forge.errors import UserError

log = logging.getLogger(__name__)


def cmd_lab(args: argparse.Namespace) -> int:
    """forge lab: build (--build) and/or serve the gallery on host:port until Ctrl-C."""
    from forge.lab.catalogue import catalogue
    from forge.lab.service import Lab

    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UserError(f"unknown --device {args.device!r} (cpu, cuda or cuda:N)")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is visible")
    entries = list(catalogue().values())
    if args.only:
        wanted = set(args.only.split(","))
        entries = [e for e in entries if e.slug in wanted or e.family in wanted]
        if not entries:
            raise UserError(f"--only {args.only!r} names no entry or family")
    socks = _bound(args) if args.serve or not args.build else None  # the port taken before a build
    lab = Lab(args.device, args.cache)
    try:
        if args.build:
            _build(lab, entries)
        if socks is not None:
            _serve(lab, args, socks)
    finally:
        lab.close()
        for s in socks or ():
            s.close()
    return 0


def _bound(args: argparse.Namespace) -> list[Any]:
    """The sockets to serve on (forge.serving.bound), after checking the ui extra is installed."""
    from forge.serving import bound, require_ui

    require_ui("lab")
    return bound(args.host, args.port)


def _build(lab: Any, entries: list[Any]) -> None:
    """Every entry at its default settings, with a progress bar and a summary."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console()
    start = time.perf_counter()
    counts: dict[str, int] = {}
    with Progress(console=console) as bar:
        job = bar.add_task("building", total=len(entries))
        for e in entries:
            bar.update(job, description=f"{e.family}: {e.slug}")
            state = lab.build(e)
            what = "vendor" if state.path == "vendor" else f"forge {state.status}"
            counts[what] = counts.get(what, 0) + 1
            bar.advance(job)
    took = time.perf_counter() - start
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    console.print(f"forge lab: {len(entries)} kernels built in {took:.0f} s on {lab.device}: {summary}")


def _serve(lab: Any, args: argparse.Namespace, socks: list[Any]) -> None:
    from forge.lab.web import create_app
    from forge.serving import serve, url

    found = _found(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: anyone who can reach it can run kernels on this machine", args.host)
    serve(create_app(lab, found), socks, f"forge lab: {url(args.host, args.port)} on {lab.device} (Ctrl-C stops)")


def _found(args: argparse.Namespace) -> list[Any]:
    """The store's kernels, when a store exists (none is created)."""
    from forge.lab.found import found_kernels
    from forge.store import Store, resolve_url

    try:
        url = resolve_url(args.db, create=False)
    except (UserError, ValueError, OSError) as e:
        log.info("no store to list kernels from: %s", e)
        return []
    try:
        return found_kernels(Store(url), args.ui_url)
    except Exception as e:  # noqa: BLE001 - the gallery serves without the store's kernels
        log.warning("cannot read the store's kernels: %s", e)
        return []


def register(sub: Any, db_help: str) -> None:
    """Add `forge lab` to the `forge` subparsers."""
    from pathlib import Path

    p = sub.add_parser("lab", help="a live gallery of kernels by family, each run on this device with a picture")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8766, help="port (default 8766)")
    p.add_argument("--build", action="store_true", help="build every kernel into the cache (generate, verify, "
                   "time; incremental: cached verdicts are kept), then exit unless --serve")
    p.add_argument("--serve", action="store_true", help="with --build: serve the gallery after building")
    p.add_argument("--only", metavar="NAMES", help="with --build: only these entries or families (comma-separated)")
    p.add_argument("--cache", type=Path, help="the lab's cache folder (default $FORGE_LAB_CACHE or ~/.cache/forge/lab)")
    p.add_argument("--db", help=db_help)
    p.add_argument("--ui-url", default="http://127.0.0.1:8765", help="where `forge ui` serves the store, for links "
                   "to the search trees (default http://127.0.0.1:8765)")
    p.set_defaults(func=cmd_lab)
