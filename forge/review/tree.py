"""forge runs, forge tree and forge show: the store in the terminal.

Untrusted text (sources, logs, messages, keys) goes to rich as `Text`, never as markup.
"""

from __future__ import annotations

import functools
import json

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from forge import terminal
from forge.review.data import NodeDetail, NodeView, RunSummary, TaskView
from forge.review.html import fmt_evaluation, fmt_num, fmt_secs, fmt_speedup, fmt_x
from forge.review.source import LEXERS
from forge.terminal import Col

_STATE_STYLE = {"done": "green", "running": "yellow"}  # any other state (failed, interrupted): red


def print_runs(summaries: list[RunSummary], console: Console | None = None) -> None:
    """The run list: model, device, policy, speedup, cost, state."""
    console = console or terminal.console()
    if not summaries:
        console.print("no runs in this store yet (forge optimize makes one)")
        return
    cols = [Col("run"), Col("started", True), Col("model"), Col("device"), Col("policy"),
            *(Col(c, True) for c in ("speedup", "LLM $", "device s", "wall")), Col("state")]
    rows = [[s.run.id, f"{s.run.created_at:%m-%d %H:%M}", Text(s.run.model.rsplit("/", 1)[-1]), Text(s.run.device),
             Text(s.run.policy), fmt_x(s.speedup), f"{s.cost.usd:.2f}", f"{s.cost.device_seconds:.1f}",
             fmt_secs(s.wall_s), Text(s.run.state, style=_STATE_STYLE.get(s.run.state, "red"))] for s in summaries]
    table = terminal.table(cols, rows, console.width, title=f"{len(summaries)} runs, newest first")
    console.print(table)


def node_label(n: NodeView) -> Text:
    """One line per node: id, status, speedup, visits, knobs; the reason when it failed."""
    text = Text(f"#{n.cand.id} ")
    if n.baseline:
        text.append("eager baseline", style="dim")
    else:
        style = "green" if n.status == "ok" else "yellow" if n.evaluation is None else "red"
        text.append(n.status, style=style)
        if n.speedup is not None:
            text.append(f" {fmt_speedup(n)}", style="bold green" if n.best else "")
    text.append(f"  visits {n.visits}", style="dim")
    if n.best:
        text.append("  ★ best", style="bold")
    if n.knobs_text():
        text.append(f"  {n.knobs_text()}", style="cyan")
    if n.failed:
        text.append(f"  {n.reason}", style="red")
    return text


def task_tree(t: TaskView) -> Tree:
    """A task's search tree as a rich Tree."""
    k = t.task
    head = Text(f"{k.key}", style="bold")
    head.append(f"  {k.family}, {100 * (k.share or 0):.1f}% of model time; {t.tried} tried, {t.failed} failed, "
                f"best {fmt_speedup(t)}{', ' + t.verdict if t.verdict else ''}; {k.stop_reason or k.state}")
    root = Tree(head)
    branch: dict[int, Tree] = {}
    for n in t.nodes:
        parent = branch.get(n.cand.parent_id) if n.cand.parent_id is not None else None
        branch[n.cand.id] = (parent or root).add(node_label(n))
    if not t.nodes:
        root.add(Text("no candidates", style="dim"))
    return root


def print_trees(tasks: list[TaskView], console: Console | None = None) -> None:
    """Every given task's tree."""
    console = console or terminal.console()
    for t in tasks:
        console.print(task_tree(t))


def print_node(d: NodeDetail, console: Console | None = None) -> None:
    """One node: facts, source, diff against its parent, build log, verification, timing, LLM text."""
    console = console or terminal.console()
    panel = functools.partial(Panel, expand=console.is_terminal)  # piped: as wide as the text, not the stream
    n, e = d.node, d.evaluation
    facts = Table(show_header=False, box=None)
    facts.add_column(style="bold")
    facts.add_column()
    rows = [("run", d.run.id), ("task", d.task.key), ("node", f"#{n.id}"),
            ("parent", f"#{n.parent_id}" if n.parent_id is not None else "- (root)"), ("backend", n.backend),
            ("entry", n.entry or "-"), ("origin", n.origin), ("status", e.status if e else n.status),
            ("knobs", " ".join(f"{k}={v}" for k, v in n.knobs.items()) or "-"), ("visits", str(n.visits)),
            ("reward", fmt_num(n.reward))]
    if e is not None:
        rows += [("message", e.message or "-"), ("speedup", fmt_evaluation(e)),
                 ("device", e.device), ("device s", f"{e.device_seconds:.2f}")]
    for a, b in rows:
        facts.add_row(a, Text(b))
    console.print(panel(facts, title=f"node #{n.id}", title_align="left"))
    source = Syntax(n.source or "", LEXERS.get(n.backend, "text"), line_numbers=True, word_wrap=True)
    console.print(panel(source, title="source", title_align="left"))  # long lines wrap: nothing is cropped
    diff = d.diff()
    shown = Syntax(diff, "diff", word_wrap=True) if diff else Text("no parent" if d.parent is None else "no change",
                                                                   style="dim")
    console.print(panel(shown, title="diff against parent", title_align="left"))
    if e is None:
        console.print(Text("not evaluated (the eager baseline, or still pending)", style="dim"))
    else:
        console.print(panel(Text(e.build_log or "(empty)"), title="build log", title_align="left"))
        console.print(panel(_verify(e.verify), title="verification", title_align="left"))
        console.print(panel(_timing(e.time_us_median, e.time_us_spread, e.verify.get("baseline")), title="timing (us)",
                            title_align="left"))
    for c in d.llm_calls:
        console.print(panel(Group(Text("prompt", style="bold"), Text(c.prompt), Text("answer", style="bold"),
                                  Text(c.response)),
                            title=Text(f"LLM call {c.provider}:{c.model} ({c.status}, {c.tokens_in} in, "
                                       f"{c.tokens_out} out, ${c.usd:.4f}, {c.latency_s:.1f} s)"), title_align="left"))
    if d.llm_calls:
        console.print(panel(source, title="code taken from the answer", title_align="left"))


def _verify(v: dict) -> Table | Text:
    sets = v.get("sets") or []
    rest = {k: val for k, val in v.items() if k not in ("sets", "baseline")}
    if not sets:
        return Text(json.dumps(rest, indent=1, default=str) if rest else "no verification detail")
    cols = sorted({k for s in sets for k in s if k != "set"})
    table = Table("set", *cols, caption=Text(json.dumps(rest, default=str)) if rest else None)
    for i, s in enumerate(sets):
        table.add_row(str(s.get("set", i)), *(f"{s[c]:.2e}" if isinstance(s.get(c), float) else str(s.get(c, ""))
                                              for c in cols))
    return table


def _timing(median: float | None, spread: dict, baseline: dict | None) -> Table | Text:
    if median is None:
        return Text("not timed (rejected before timing)")
    table = Table("", "median", "p10", "p90", "mean", "std", "n")
    table.add_row("candidate", f"{median:.2f}", *(fmt_num(spread.get(k), 2) if k != "n" else str(spread.get(k, "-"))
                                                  for k in ("p10", "p90", "mean", "std", "n")))
    if baseline:
        table.add_row("eager", fmt_num(baseline.get("median"), 2), fmt_num(baseline.get("p10"), 2),
                      fmt_num(baseline.get("p90"), 2), "-", "-", str(baseline.get("n", "-")))
    return table
