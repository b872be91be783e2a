"""HTML of the report and of the web UI, rendered by Jinja2 templates (forge/review/templates/) with autoescape.

Important: candidate sources, build logs, verification messages, LLM prompts and answers, task keys and
model names are untrusted text; they reach HTML only through the templates' autoescape, Pygments (which
escapes what it highlights) or the SVG charts (markupsafe). Nothing here marks store text safe.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from forge import confidence
from forge.review import source, svg
from forge.review.data import NodeDetail, NodeView, RunSummary, RunView, TaskView
from forge.store import EvaluationRecord
from forge.store.recorder import result_of

CSS = (Path(__file__).parent / "static" / "forge.css").read_text() + "\n" + source.stylesheet()


def fmt_x(x: float | None) -> str:
    """A speedup such as 1.23x, or a dash."""
    return f"{x:.2f}x" if x is not None else "-"


def fmt_speedup(v: TaskView | NodeView) -> str:
    """A task's or node's speedup with its interval, `~` when noisy: `2.35x [2.20-2.51]`, or a dash."""
    return confidence.fmt(v.speedup, v.speedup_ci, v.noisy)


def fmt_evaluation(e: EvaluationRecord | None) -> str:
    """An evaluation's speedup with its interval, `~` when noisy, if it passed; else a dash."""
    if e is None or e.status != "ok":
        return "-"
    res = result_of(e)
    return confidence.fmt(res.speedup, confidence.speedup_ci(res.baseline, res.timing),
                          confidence.noisy(res.timing) or confidence.noisy(res.baseline))


def fmt_num(x: float | None, digits: int = 3) -> str:
    """A number with fixed digits, or a dash."""
    return f"{x:.{digits}f}" if x is not None else "-"


def fmt_secs(s: float) -> str:
    """Seconds as 12.3 s, 4m05s or 1h02m."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def fmt_when(t: datetime) -> str:
    """A UTC time to the minute."""
    return f"{t:%Y-%m-%d %H:%M} UTC"


def fmt_pct(share: float | None) -> str:
    """A share of model time as 12.3%."""
    return f"{100 * (share or 0):.1f}%"


@functools.cache
def env() -> Environment:
    """The template environment: autoescape on for every template, undefined names an error."""
    e = Environment(loader=PackageLoader("forge.review", "templates"), autoescape=select_autoescape(default=True),
                    undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    e.filters.update(x=fmt_x, speedup=fmt_speedup, num=fmt_num, secs=fmt_secs, when=fmt_when, pct=fmt_pct)
    e.globals.update(highlight=source.highlight, split_prelude=source.split_prelude)
    return e


def render_page(name: str, **context: Any) -> Markup:
    """Render one template (the result is HTML, safe to put into another template)."""
    return Markup(env().get_template(name).render(**context))


def page(template: str, title: str, *, inline_css: bool, scripts: Sequence[str] = (),
         body_attrs: Mapping[str, str] | None = None, **context: Any) -> Markup:
    """A whole HTML document; inline_css for the standalone report (no script, nothing fetched), else the app's
    stylesheets."""
    return render_page(template, title=title, inline_css=inline_css, css=Markup(CSS) if inline_css else "",
                  scripts=scripts, body_attrs=body_attrs or {}, **context)


def runs_table(summaries: Sequence[RunSummary], link: bool = True) -> Markup:
    """The run list: model, device, policy, speedup, cost, state (and links to compare runs of one model)."""
    return render_page("runs_table.html", summaries=summaries, link=link, previous=previous_of_model(summaries))


def previous_of_model(summaries: Sequence[RunSummary]) -> dict[str, str]:
    """For each run (newest first), the id of the next older run of the same model, if any."""
    older: dict[str, str] = {}
    last_seen: dict[str, str] = {}
    for s in reversed(summaries):  # oldest first
        if s.run.model in last_seen:
            older[s.run.id] = last_seen[s.run.model]
        last_seen[s.run.model] = s.run.id
    return older


def cost_rows(s: RunSummary) -> list[tuple[str, str]]:
    """Money, tokens, device and wall time, and speedup gained per dollar and per device-hour."""
    c = s.cost
    per_usd, per_hour = s.per_dollar(), s.per_device_hour()
    return [("LLM cost", f"${c.usd:.4f} over {c.llm_calls} calls"),
            ("tokens", f"{c.tokens_in:,} in, {c.tokens_out:,} out"),
            ("device time", f"{c.device_seconds:.1f} s over {c.evaluations} evaluations"),
            ("wall time", fmt_secs(s.wall_s)),
            ("speedup gained per dollar", "-" if per_usd is None else f"{per_usd:.3g} (speedup - 1) / $"),
            ("speedup gained per device-hour", "-" if per_hour is None else f"{per_hour:.3g} (speedup - 1) / h")]


def run_charts(view: RunView) -> dict[str, str]:
    """The run's SVG charts: end to end, op families, best-so-far curves against candidates and against wall
    time ("" when there is no data)."""
    r = view.run
    out = {"e2e": "", "families": "", "curves": "", "wall": ""}
    if r.eager_ms and r.forge_ms:
        out["e2e"] = svg.hbars([("eager", r.eager_ms), ("forge", r.forge_ms)], "ms", "end-to-end model time")
    fams = view.families()
    if fams:
        rows = [("before", [(f, b) for f, b, _ in fams]), ("after", [(f, a) for f, _, a in fams])]
        out["families"] = svg.stacked(rows, "ms", "profiled model time by op family, before and after")
    curves = [(t.task.key, list(t.curve)) for t in view.tasks if t.curve]
    decided = [t.task.key for t in view.tasks if t.progress.decided]
    if curves:
        out["curves"] = svg.step_lines(curves, "best speedup so far against candidates tried",
                                       "candidates tried", "best speedup (x)", decided=decided)
    wall = view.wall_series()
    if wall:
        out["wall"] = svg.step_xy(wall, "best speedup so far against wall time", "wall time since the run started (s)",
                                  "speedup (x)", decided=decided)
    return out


def run_sections(view: RunView, link: bool) -> Markup:
    """The body of the report and of the run page."""
    return render_page("run_sections.html", view=view, s=view.summary, r=view.run, link=link, charts=run_charts(view),
                  cost=cost_rows(view.summary), budget=view.budget)


def node_facts(d: NodeDetail) -> list[tuple[str, str]]:
    """A node's facts table: ids, backend, origin, status, knobs, visits, reward, speedup, message."""
    n, e = d.node, d.evaluation
    facts = [("node", f"#{n.id}"), ("task", d.task.key), ("parent", f"#{n.parent_id}" if n.parent_id else "-"),
             ("backend", n.backend), ("origin", n.origin), ("status", e.status if e else n.status),
             ("knobs", " ".join(f"{k}={v}" for k, v in n.knobs.items()) or "-"), ("visits", str(n.visits)),
             ("reward", fmt_num(n.reward)), ("speedup", fmt_evaluation(e))]
    if e and e.message:
        facts.append(("message", e.message))
    return facts


def verify_table(v: dict) -> tuple[list[str], list[list[str]], str]:
    """Verification sets as (head, rows) and whatever else it recorded as JSON text."""
    sets = v.get("sets") or []
    head = ["set"] + sorted(k for k in (sets[0] if sets else {}) if k != "set")
    rows = [[str(s.get("set", i))] + [f"{s[k]:.2e}" if isinstance(s.get(k), float) else str(s.get(k, ""))
                                      for k in head[1:]] for i, s in enumerate(sets)]
    rest = {k: val for k, val in v.items() if k not in ("sets", "baseline")}
    return head, rows, json.dumps(rest, indent=1, default=str) if rest else ""


def timing(median: float | None, spread: dict, baseline: dict | None) -> dict[str, Any] | None:
    """The timing chart and its note (None when the node was not timed)."""
    if median is None:
        return None
    rows = [("candidate", {"median": median, **{k: spread.get(k) for k in ("p10", "p90", "mean")}})]
    if baseline:
        rows.append(("eager", {"median": baseline.get("median"), "p10": baseline.get("p10"),
                               "p90": baseline.get("p90")}))
    stats = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in spread.items()
                      if v is not None)
    note = f"candidate (us): median {median:.2f}, {stats}"
    if baseline:
        note += f"; eager (us): median {baseline.get('median', 0):.2f}, n {baseline.get('n')}"
    return {"chart": svg.ranges(rows, "us", "timing distribution: p10..p90 box, median bar, mean dot"), "note": note}


def node_panel(d: NodeDetail) -> Markup:
    """A node: header, source (prelude folded), diff, build log, verification, timing, LLM prompt and answer."""
    e = d.evaluation
    return render_page("node_panel.html", d=d, n=d.node, e=e, status=e.status if e else d.node.status,
                  facts=node_facts(d), diff=diff_lines(d.diff()), verify=verify_table(e.verify) if e else None,
                  timing=timing(e.time_us_median, e.time_us_spread, e.verify.get("baseline")) if e else None)


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs."""
    def cls(line: str) -> str:
        return "add" if line.startswith("+") else "del" if line.startswith("-") else (
            "hunk" if line.startswith("@@") else "")
    return [(cls(line), line) for line in text.splitlines()]


def nodes_table(t: TaskView) -> Markup:
    """A task's nodes as a sortable table: id, status, speedup with its interval, knobs, origin, visits."""
    return render_page("nodes_table.html", t=t)


def task_summary(t: TaskView) -> Markup:
    """A task page's header line."""
    return render_page("task_summary.html", t=t, k=t.task)
