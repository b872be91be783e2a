"""What a person reads: consoles and tables that keep every number whole.

`console()`: on a terminal, rich's console at the terminal's width; piped or redirected, plain text (no
colour) as wide as its lines, so nothing wraps or is cut. `table()`: a rich table whose numeric columns are
never folded, cut or squeezed (each as wide as its widest cell) while text columns fold onto more lines;
where even that does not fit the console's width, each row becomes a block of `column: value` lines.
Cells are text, never rich markup (keys, stop reasons and messages may hold brackets).
`RunProgress`: forge optimize's progress (forge.progress's events) as a rich.progress display, or as plain
lines where the console is not a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich import box as boxes
from rich import progress as bars
from rich.console import Console, Group, RenderableType
from rich.file_proxy import FileProxy
from rich.table import Column, Table
from rich.text import Text

from forge.progress import Progress

PLAIN_WIDTH = 100_000  # a stream that is not a terminal: lines as long as they are
TEXT_MIN = 8  # the narrowest a text column folds to before rows become blocks
Cell = str | Text


@dataclass(frozen=True)
class Col:
    """A column: its header, whether it holds numbers (kept whole), and its alignment."""

    name: str
    numeric: bool = False
    justify: str = ""  # default: right for numbers, left for text

    @property
    def align(self) -> str:
        return self.justify or ("right" if self.numeric else "left")


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width there, plain and unbounded when piped."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PLAIN_WIDTH, color_system=None, highlight=False)


def _width(cell: Cell) -> int:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max((len(line) for line in text.splitlines()), default=0)


def table(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int, title: str = "",
          box: boxes.Box | None = boxes.SIMPLE_HEAD) -> RenderableType:
    """The rows as a table that fits `width` (a console's) with every numeric cell whole, else as blocks."""
    natural = [max([len(c.name)] + [_width(r[i]) for r in rows]) for i, c in enumerate(cols)]
    pad = 2 + (1 if box is not None and box is not boxes.SIMPLE_HEAD else 0)  # cell padding (+ a rule)
    least = sum(n if c.numeric else min(n, TEXT_MIN) for c, n in zip(cols, natural, strict=True))
    if least + pad * len(cols) + 2 > width:
        return _blocks(cols, rows, title)
    out = Table(title=title or None, title_justify="left", box=box)
    for c, n in zip(cols, natural, strict=True):
        if c.numeric:
            out.add_column(c.name, justify=c.align, no_wrap=True, min_width=n)  # type: ignore[arg-type]
        else:
            out.add_column(c.name, justify=c.align, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        out.add_row(*(c if isinstance(c, Text) else Text(c) for c in r))  # text, never markup
    return out


def _blocks(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str) -> RenderableType:
    """Each row as its first cell, then `column: value` lines (a table too wide for the console)."""
    parts: list[RenderableType] = [Text(title, style="bold")] if title else []
    for r in rows:
        head = r[0].copy() if isinstance(r[0], Text) else Text(str(r[0]))
        head.stylize("bold")
        parts.append(head)
        for c, cell in zip(cols[1:], r[1:], strict=True):
            parts.append(Text.assemble(f"  {c.name}: ", cell if isinstance(cell, Text) else Text(str(cell))))
    return Group(*parts)


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss from an hour)."""
    m, sec = divmod(int(max(0.0, seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"


def _text(field: str, wrap: bool = False) -> bars.TextColumn:
    """A column of text (never markup: keys and stop reasons may hold brackets), on one line unless `wrap`."""
    return bars.TextColumn(field, markup=False, table_column=Column(no_wrap=not wrap, overflow="fold"))


class _Clock(bars.ProgressColumn):
    """The run's row: time elapsed and, where the run has a deadline, the time left to it."""

    def __init__(self, shown: RunProgress) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.shown = shown

    def render(self, task: bars.Task) -> Text:
        return Text(self.shown.times() if task.fields.get("run") else "", style="cyan")


class RunProgress(Progress):
    """forge optimize's progress on `out`: on a terminal, a live rich.progress display (the stage, the
    candidates done of the budget, the elapsed and remaining time, each task's candidates and best speedup);
    elsewhere (piped, CI) plain lines, one a stage and one a finished task, each with the time, no control
    characters. A context manager: the live display stops on leaving it, also on Ctrl-C."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.live = out.is_terminal and not out.is_dumb_terminal
        self.t0 = time.monotonic()
        self.ends: float | None = None  # the run's deadline (time.monotonic())
        self.candidates, self.per_task = 0, 0
        self.tried: dict[str, int] = {}  # task key -> candidates evaluated
        whole = Column(no_wrap=True)  # keys and numbers stay whole; the note (last) folds onto more lines
        self.bars = bars.Progress(bars.TextColumn("{task.description}", markup=False, table_column=whole),
                                  bars.BarColumn(bar_width=20), _text("{task.fields[count]}"), _Clock(self),
                                  _text("{task.fields[note]}", wrap=True), console=out,
                                  redirect_stdout=False, redirect_stderr=False)
        self.run = self.bars.add_task("starting", total=None, count="", note="", run=True)
        self.rows: dict[str, bars.TaskID] = {}
        self.logs: list[tuple[logging.StreamHandler, Any]] = []  # (handler, its own stream) while live

    def __enter__(self) -> RunProgress:
        if self.live:  # log lines (warnings, -v) go above the display, not through it
            self.logs = [(h, h.setStream(FileProxy(self.out, h.stream))) for h in logging.getLogger().handlers
                         if type(h) is logging.StreamHandler and h.stream is self.out.file]
            self.bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self.live:
            self.bars.stop()
            for h, stream in self.logs:
                h.setStream(stream)

    def times(self) -> str:
        """'0:42 elapsed, ~1:18 left': the time left to the run's deadline, where it has one ('0:05 over' past it:
        a first Inductor compilation and the final timing may run over)."""
        now = time.monotonic()
        left = "" if self.ends is None else f", ~{clock(self.ends - now)} left" if now <= self.ends else \
            f", {clock(now - self.ends)} over"
        return f"{clock(now - self.t0)} elapsed{left}"

    def done(self) -> int:
        """Candidates evaluated so far, over all tasks."""
        return sum(self.tried.values())

    def _line(self, text: str) -> None:
        if not self.live:
            self.out.print(Text(f"forge: {text} ({self.times()})"), soft_wrap=True)

    def start(self, ends: float | None) -> None:
        self.t0, self.ends = time.monotonic(), ends

    def stage(self, name: str) -> None:
        n, of = self.done(), self.candidates
        lines = {"capture": "capture and profile the model",
                 "compile": "compile: the model by torch.compile, timed (the floor forge's result must beat)",
                 "probe": f"probe: {len(self.tried)} tasks to search, the first candidates of each; budget {of} "
                          f"candidates, at most {self.per_task} a task",
                 "search": f"search: the rest by share x headroom; {n}/{of} candidates so far",
                 "variants": f"variants: the found kernels timed end to end; {n}/{of} candidates searched",
                 "done": f"done; {n}/{of} candidates"}
        self._line(lines.get(name, name))
        count = f"{n}/{of} candidates" if name != "capture" else ""
        self.bars.update(self.run, description=name, count=count)

    def searching(self, tasks: dict[str, int], candidates: int, per_task: int) -> None:
        self.tried, self.candidates, self.per_task = dict(tasks), candidates, per_task
        self.bars.update(self.run, total=max(candidates, 1), completed=self.done())
        for key, n in tasks.items():
            if n:
                self._row(key, n, None, "")

    def task(self, key: str, tried: int, best: float | None) -> None:
        self.tried[key] = tried
        self._row(key, tried, best, "")
        n = self.done()
        self.bars.update(self.run, completed=n, count=f"{n}/{self.candidates} candidates")

    def task_done(self, key: str, tried: int, best: float | None, reason: str) -> None:
        self.tried[key] = tried
        self._row(key, tried, best, f"; stopped: {reason}")
        speed = f", best so far {best:.2f}x" if best else ""  # the decided one, timed again, is in the table
        self._line(f"task {key}: {tried} candidates{speed} ({self.done()}/{self.candidates} in all); "
                   f"stopped: {reason}")

    def _row(self, key: str, tried: int, best: float | None, stop: str) -> None:
        """Task `key`'s row: its candidates of the most a task gets, its best speedup, why it stopped."""
        note = (f"best {best:.2f}x" if best else "no speedup yet") + stop
        if key not in self.rows:
            self.rows[key] = self.bars.add_task(f"  {key}", total=max(self.per_task, tried, 1), count="", note="")
            shown = [r for r in self.bars.tasks if r.visible and r.id != self.run]
            if len(shown) > max(3, self.out.height - 4):  # the oldest task rows go; the newest stay on screen
                self.bars.update(shown[0].id, visible=False)
        self.bars.update(self.rows[key], completed=tried, count=f"{tried}/{max(self.per_task, tried)}", note=note)
