"""HTML fragments shared by the HTML report and the web UI. Every value from the store is escaped.

Important: candidate sources, build logs, verification messages, LLM prompts and answers, task keys and
model names are untrusted text; they only ever reach HTML through `esc`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from forge import confidence
from forge.review import svg
from forge.review.data import NodeDetail, NodeView, RunSummary, RunView, TaskView
from forge.review.svg import esc
from forge.store import EvaluationRecord
from forge.store.recorder import result_of

CSS = (Path(__file__).parent / "static" / "forge.css").read_text()


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


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """A table whose cells are already HTML (escape before calling)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, body: str, *, inline_css: bool, scripts: Sequence[str] = (), body_attrs: str = "") -> str:
    """A whole HTML document; inline_css for the standalone report, else the app's stylesheet."""
    if inline_css:  # the report: no scripts at all, nothing fetched
        head = ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
                f'style-src \'unsafe-inline\'; img-src data:"><style>{CSS}</style>')
    else:
        head = '<link rel="stylesheet" href="/static/forge.css">'
    head += "".join(f'<script src="{esc(s)}" defer></script>' for s in scripts)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{head}</head>'
            f"<body {body_attrs}>{body}</body></html>")


def state_badge(state: str) -> str:
    """A run or task state as a coloured badge."""
    return f'<span class="badge state-{esc(state)}">{esc(state)}</span>'


def runs_table(summaries: Sequence[RunSummary], link: bool = True) -> str:
    """The run list: model, device, policy, speedup, cost, state."""
    rows = []
    for s in summaries:
        r = s.run
        rid = f'<a href="/runs/{esc(r.id)}">{esc(r.id)}</a>' if link else esc(r.id)
        rows.append([rid, esc(fmt_when(r.created_at)), esc(r.model), esc(r.device), esc(r.policy),
                     esc(fmt_x(s.speedup)), f"${s.cost.usd:.2f}", esc(f"{s.cost.device_seconds:.1f} s"),
                     esc(fmt_secs(s.wall_s)), state_badge(r.state)])
    if not rows:
        return '<p class="empty">No runs in this store yet: run <code>forge optimize</code>.</p>'
    return _table(["run", "started", "model", "device", "policy", "speedup", "LLM $", "device time", "wall",
                   "state"], rows, "runs")


def tasks_table(view: RunView, link: bool) -> str:
    """Per task: family, share, eager and best time, speedup, candidates, state and stop reason."""
    rows = []
    for t in view.tasks:
        k = t.task
        key = f'<a href="/runs/{esc(k.run_id)}/tasks/{k.id}">{esc(k.key)}</a>' if link else esc(k.key)
        rows.append([key, esc(k.family), esc(f"{100 * (k.share or 0):.1f}%"), esc(fmt_num(t.eager_us, 1)),
                     esc(fmt_num(t.best_us, 1)), esc(fmt_speedup(t)), str(t.tried), str(t.failed),
                     state_badge(k.state), esc(k.stop_reason or "")])
    return _table(["task", "family", "share", "eager us", "best us", "speedup", "tried", "failed", "state",
                   "stopped"], rows, "tasks")


def cost_table(s: RunSummary) -> str:
    """Money, tokens, device and wall time, and speedup gained per dollar and per device-hour."""
    c = s.cost
    per_usd, per_hour = s.per_dollar(), s.per_device_hour()
    rows = [["LLM cost", f"${c.usd:.4f} over {c.llm_calls} calls"],
            ["tokens", f"{c.tokens_in:,} in, {c.tokens_out:,} out"],
            ["device time", f"{c.device_seconds:.1f} s over {c.evaluations} evaluations"],
            ["wall time", fmt_secs(s.wall_s)],
            ["speedup gained per dollar", "-" if per_usd is None else f"{per_usd:.3g} (speedup - 1) / $"],
            ["speedup gained per device-hour", "-" if per_hour is None else f"{per_hour:.3g} (speedup - 1) / h"]]
    return _table(["cost", ""], [[esc(a), esc(b)] for a, b in rows], "kv")


def run_charts(view: RunView) -> dict[str, str]:
    """The run's SVG charts: end to end, op families, best-so-far curves ("" when there is no data)."""
    r = view.run
    out = {"e2e": "", "families": "", "curves": ""}
    if r.eager_ms and r.forge_ms:
        out["e2e"] = svg.hbars([("eager", r.eager_ms), ("forge", r.forge_ms)], "ms", "end-to-end model time")
    fams = view.families()
    if fams:
        rows = [("before", [(f, b) for f, b, _ in fams]), ("after", [(f, a) for f, _, a in fams])]
        out["families"] = svg.stacked(rows, "ms", "profiled model time by op family, before and after")
    curves = [(t.task.key, list(t.curve)) for t in view.tasks if t.curve]
    if curves:
        out["curves"] = svg.step_lines(curves, "best speedup so far against candidates tried",
                                       "candidates tried", "best speedup (x)")
    return out


def run_sections(view: RunView, link: bool) -> str:
    """The body of the report and of the run page."""
    s, r = view.summary, view.run
    charts = run_charts(view)
    e2e = (f"eager {r.eager_ms:.3f} ms, forge {r.forge_ms:.3f} ms: <strong>{esc(fmt_x(s.speedup))}</strong>"
           + ("" if s.applied else " (forge kept the eager model: its kernels were not faster end to end)")
           if r.eager_ms and r.forge_ms else "not measured yet")
    parts = [
        f'<header><h1>run {esc(r.id)} {state_badge(r.state)}</h1><p class="meta">{esc(r.model)} on '
        f"{esc(r.device)} ({esc(r.dtype)}), policy {esc(r.policy)}, started {esc(fmt_when(r.created_at))}"
        + (f", finished {esc(fmt_when(r.finished_at))}" if r.finished_at else "") + "</p></header>",
        f'<section><h2>End to end</h2><p>{e2e}</p>{charts["e2e"]}</section>',
        f"<section><h2>Tasks</h2>{tasks_table(view, link)}</section>",
        '<section><h2>Model time by op family</h2><p class="note">Profiled time of each task; after divides '
        "each shipped task's time by its speedup. Tasks too small to search are in \"other\".</p>"
        f'{charts["families"] or "<p>no timed tasks</p>"}</section>',
        '<section><h2>Search progress</h2><p class="note">Per task: the highest speedup of a candidate so '
        "far, each against eager timed alongside it.</p>"
        f'{charts["curves"] or "<p>no candidates evaluated yet</p>"}</section>',
        f"<section><h2>Cost</h2>{cost_table(s)}</section>",
    ]
    return "".join(parts)


def _pre(text: str, cls: str = "") -> str:
    return f'<pre class="{cls}">{esc(text)}</pre>' if text else '<p class="empty">none</p>'


def _diff(text: str) -> str:
    if not text:
        return '<p class="empty">no parent (a root) or no change</p>'
    lines = []
    for line in text.splitlines():
        cls = "add" if line.startswith("+") else "del" if line.startswith("-") else "hunk" if line.startswith(
            "@@") else ""
        lines.append(f'<span class="{cls}">{esc(line)}</span>')
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def node_panel(d: NodeDetail) -> str:
    """A node: header, source, diff, build log, verification, timing distribution, LLM prompt and answer."""
    n, e = d.node, d.evaluation
    status = e.status if e else n.status
    facts = [("node", f"#{n.id}"), ("task", d.task.key), ("parent", f"#{n.parent_id}" if n.parent_id else "-"),
             ("backend", n.backend), ("origin", n.origin), ("status", status),
             ("knobs", " ".join(f"{k}={v}" for k, v in n.knobs.items()) or "-"), ("visits", str(n.visits)),
             ("reward", fmt_num(n.reward)), ("speedup", fmt_evaluation(e))]
    if e and e.message:
        facts.append(("message", e.message))
    parts = [f'<h2 class="node-title">node #{n.id} <span class="badge status-{esc(status)}">{esc(status)}</span></h2>',
             _table(["", ""], [[esc(a), esc(b)] for a, b in facts], "kv"),
             f'<h3>Source</h3>{_pre(n.source, "code")}', f"<h3>Diff against parent</h3>{_diff(d.diff())}"]
    if e is None:
        parts.append('<p class="empty">not evaluated (the eager baseline, or still pending)</p>')
    else:
        parts.append(f'<h3>Build log</h3>{_pre(e.build_log, "log")}')
        parts.append(f"<h3>Verification</h3>{_verify(e.verify)}")
        parts.append(f"<h3>Timing</h3>{_timing(e.time_us_median, e.time_us_spread, e.verify.get('baseline'))}")
    for c in d.llm_calls:
        parts.append(f"<h3>LLM call {esc(c.provider)}:{esc(c.model)} ({esc(c.status)}, {c.tokens_in} in, "
                     f"{c.tokens_out} out, ${c.usd:.4f})</h3><h4>Prompt</h4>{_pre(c.prompt, 'llm')}"
                     f"<h4>Answer</h4>{_pre(c.response, 'llm')}")
    return f'<div class="node" data-node="{n.id}">{"".join(parts)}</div>'


def _verify(v: dict) -> str:
    sets = v.get("sets") or []
    rows = [[esc(s.get("set", i))] + [esc(f"{s[k]:.2e}" if isinstance(s[k], float) else s[k])
                                      for k in sorted(s) if k != "set"] for i, s in enumerate(sets)]
    head = ["set"] + sorted(k for k in (sets[0] if sets else {}) if k != "set")
    table = _table([esc(h) for h in head], rows, "verify") if sets else ""
    rest = {k: val for k, val in v.items() if k not in ("sets", "baseline")}
    return table + (_pre(json.dumps(rest, indent=1, default=str), "log") if rest else "")


def _timing(median: float | None, spread: dict, baseline: dict | None) -> str:
    if median is None:
        return '<p class="empty">not timed (rejected before timing)</p>'
    rows = [("candidate", {"median": median, **{k: spread.get(k) for k in ("p10", "p90", "mean")}})]
    if baseline:
        rows.append(("eager", {"median": baseline.get("median"), "p10": baseline.get("p10"),
                               "p90": baseline.get("p90")}))
    stats = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in spread.items()
                      if v is not None)
    return (svg.ranges(rows, "us", "timing distribution: p10..p90 box, median bar, mean dot") +
            f'<p class="note">candidate (us): median {median:.2f}, {esc(stats)}'
            + (f"; eager (us): median {baseline.get('median', 0):.2f}, n {esc(baseline.get('n'))}" if baseline else "")
            + "</p>")


def task_summary(t: TaskView) -> str:
    """A task page's header line."""
    k = t.task
    return (f"<p class=\"meta\">{esc(k.family)}, {esc(f'{100 * (k.share or 0):.1f}%')} of model time, "
            f"count {k.count}; {t.tried} candidates tried, {t.failed} failed; "
            f"best {esc(fmt_speedup(t))}{esc(_verdict(t))}; "
            f"{state_badge(k.state)} {esc(k.stop_reason or '')}</p>")


def _verdict(t: TaskView) -> str:
    """", the search's verdict" where it reached one."""
    return f", {t.verdict}" if t.verdict else ""
