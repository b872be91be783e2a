"""The review subcommands of `forge` (runs, tree, show, report, ui): argparse wiring and thin handlers."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from forge.errors import UserError
from forge.files import write

log = logging.getLogger(__name__)


@contextmanager
def _user_errors() -> Iterator[None]:
    """A missing store, run, task or node is bad input: one line, exit 2."""
    try:
        yield
    except (FileNotFoundError, KeyError) as e:
        raise UserError(str(e.args[0]) if e.args else str(e)) from e


def _write_json(path: str | None, data: Any) -> bool:
    """`data` as JSON to `path` ("-": standard output, and nothing else is printed); whether it went to stdout."""
    import json

    if not path:
        return False
    text = json.dumps(data, indent=1, default=str) + "\n"
    if path == "-":
        print(text, end="")
        return True
    write(path, text)
    return False


def _store(args: argparse.Namespace) -> Any:
    from forge.review.data import open_store

    return open_store(args.db)


def cmd_runs(args: argparse.Namespace) -> int:
    """forge runs: the run list."""
    from forge.review.data import list_summaries
    from forge.review.jsonviews import runs_json
    from forge.review.tree import print_runs

    with _user_errors():
        summaries = list_summaries(_store(args), limit=args.limit or None)
    if not _write_json(args.json, runs_json(summaries)):
        print_runs(summaries)
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    """forge tree: each task's search tree (or one task's)."""
    from forge.review.data import find_run, find_task, task_view
    from forge.review.jsonviews import tree_json
    from forge.review.tree import print_trees

    with _user_errors():
        store = _store(args)
        run = find_run(store, args.run)
        tasks = [find_task(store, run.id, args.task)] if args.task else store.get_tasks(run.id)
        views = [task_view(store, t) for t in sorted(tasks, key=lambda t: -(t.share or 0.0))]
    views = [v for v in views if v.nodes or args.task]
    if not _write_json(args.json, {"run_id": run.id, "tasks": [tree_json(v, run.state) for v in views]}):
        print_trees(views)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """forge show: one node in full."""
    from forge.review.data import find_run, node_detail
    from forge.review.jsonviews import node_json
    from forge.review.tree import print_node

    with _user_errors():
        store = _store(args)
        run = find_run(store, args.run)
        ref = args.node.lstrip("#")
        if not ref.isdigit():
            raise UserError(f"node must be a number as forge tree shows it (e.g. 42), not {args.node!r}")
        detail = node_detail(store, int(ref), run.id)
    if not _write_json(args.json, node_json(detail)):
        print_node(detail)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """forge report: the run's report in the terminal, and as HTML and/or JSON files."""
    from forge.review.data import find_run, run_view
    from forge.review.report import print_report, write_comparison, write_report

    with _user_errors():
        store = _store(args)
        view = run_view(store, find_run(store, args.run))
        other = run_view(store, find_run(store, args.compare)) if args.compare else None
    print_report(view)
    if other is not None:
        if not args.html:
            raise UserError("--compare writes the comparison as HTML: give --html PATH")
        write_comparison(view, other, args.html)
        write_report(view, None, args.json)
        return 0
    write_report(view, args.html, args.json)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    """forge ui: the read-only web app on host:port until Ctrl-C."""
    from forge.serving import bound, require_ui, serve, url

    require_ui("ui")
    from forge.review.web import create_app

    with _user_errors():
        store = _store(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: anyone who can reach it can read every run", args.host)
    socks = bound(args.host, args.port)
    serve(create_app(store), socks, f"forge ui: {url(args.host, args.port)} serving the store {store.where} "
          "(Ctrl-C stops)")
    return 0


def register(sub: Any, db_help: str = "the run store: a SQLite path or SQLAlchemy URL (default: $FORGE_DB if set, "
             "else runs/forge.db)", epilog: str | None = None) -> None:
    """Add the review subcommands to the `forge` subparsers."""

    def add(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, epilog=epilog)
        p.add_argument("--db", help=db_help)
        p.set_defaults(func=func)
        return p

    json_help = "also write it as JSON to PATH ('-': standard output, instead of the table)"
    p = add("runs", "list the runs in the store (model, device, policy, speedup, cost, state)", cmd_runs)
    p.add_argument("--json", metavar="PATH", help=json_help)
    p.add_argument("--limit", type=int, default=0, help="newest N runs only (0: all)")
    p = add("tree", "draw a run's search trees (status, speedup, visits; failed nodes with their reason)", cmd_tree)
    p.add_argument("run", help="run id, a unique prefix of it, or 'last'")
    p.add_argument("--task", metavar="KEY", help="only this task (its key or a unique prefix)")
    p.add_argument("--json", metavar="PATH", help=json_help)
    p = add("show", "print one node: source, diff, build log, verification, timing, LLM prompt and answer", cmd_show)
    p.add_argument("run", help="run id, a unique prefix of it, or 'last'")
    p.add_argument("node", help="node id (as forge tree shows it, e.g. 42 or #42)")
    p.add_argument("--json", metavar="PATH", help=json_help)
    p = add("report", "a run's report: end to end, tasks, op families, progress, cost", cmd_report)
    p.add_argument("run", help="run id, a unique prefix of it, or 'last'")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--compare", metavar="RUN", help="with --html: write RUN against this one side by side instead")
    p = add("ui", "serve the read-only review web app (needs the ui extra)", cmd_ui)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
