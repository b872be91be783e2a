"""Two runs side by side (normally of one model): end to end, cost, and per task (matched by key) each run's
best speedup, candidates tried and state. The UI's /compare page and `forge report A --compare B --html`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from forge.review import html
from forge.review.data import RunView, TaskView


@dataclass(frozen=True)
class TaskPair:
    """One task key and its view in each run (None where that run has no such task)."""

    key: str
    a: TaskView | None
    b: TaskView | None

    @property
    def ratio(self) -> float | None:
        """b's best speedup over a's (above 1: b did better on this task)."""
        sa, sb = (t.speedup if t else None for t in (self.a, self.b))
        return sb / sa if sa and sb else None


def pair_tasks(a: RunView, b: RunView) -> list[TaskPair]:
    """Tasks of both runs matched by key: a's order first (biggest share first), then b's others."""
    ta = {t.task.key: t for t in a.tasks}
    tb = {t.task.key: t for t in b.tasks}
    keys = list(ta) + [k for k in tb if k not in ta]
    return [TaskPair(k, ta.get(k), tb.get(k)) for k in keys]


def summary_rows(a: RunView, b: RunView) -> list[tuple[str, str, str]]:
    """(what, run a, run b): model, device, policy, state, speedup, candidates, cost, wall time."""
    def facts(v: RunView) -> list[str]:
        s, r = v.summary, v.run
        return [r.model, f"{r.device} ({r.dtype})", r.policy, r.state, html.fmt_x(s.speedup),
                f"{v.tried}" + (f" of {v.budget}" if v.budget else ""), f"${s.cost.usd:.4f}",
                f"{s.cost.device_seconds:.1f} s", html.fmt_secs(s.wall_s), html.fmt_when(r.created_at)]
    names = ["model", "device", "policy", "state", "end-to-end speedup", "candidates", "LLM cost", "device time",
             "wall time", "started"]
    return list(zip(names, facts(a), facts(b), strict=True))


def compare_page(a: RunView, b: RunView, *, inline_css: bool, scripts: Sequence[str] = ()) -> Markup:
    """The comparison as a whole page (links into the UI unless inline_css: the standalone report)."""
    return html.page("compare.html", f"forge compare {a.run.id} {b.run.id}", inline_css=inline_css, scripts=scripts,
                     a=a, b=b, rows=summary_rows(a, b), pairs=pair_tasks(a, b), link=not inline_css,
                     same_model=a.run.model == b.run.model)
