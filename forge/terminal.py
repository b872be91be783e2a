"""What a person reads: consoles and tables that keep every number whole.

`console()`: on a terminal, rich's console at the terminal's width; piped or redirected, plain text (no
colour) as wide as its lines, so nothing wraps or is cut. `table()`: a rich table whose numeric columns are
never folded, cut or squeezed (each as wide as its widest cell) while text columns fold onto more lines;
where even that does not fit the console's width, each row becomes a block of `column: value` lines.
Cells are text, never rich markup (keys, stop reasons and messages may hold brackets).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich import box as boxes
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

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
