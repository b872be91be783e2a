"""Kernel sources for review: the prelude (the generated headers and helpers before the kernel) split off,
and syntax highlighting with Pygments (CSS classes, so the UI's Content-Security-Policy needs no inline style).

Important: Pygments escapes the source it highlights; what `highlight` returns is safe HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from markupsafe import Markup
from pygments import highlight as _pygments
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from forge.backends import BACKENDS

LEXERS = {**{name: b.lexer for name, b in BACKENDS.items()}, "eager": "python"}  # eager: the reference
MARKER = "// forge recipe"  # the recipes' first line after their prelude (forge/policy/recipes)
# Otherwise the kernel starts at its first kernel or entry definition (the comments right above it included).
KERNEL_START = re.compile(r"^\s*(__global__|@triton\.jit|extern \"C\"|(int|void|FORGE_\w+)\s+\w*(forge_)?launch\b"
                          r"|def launch\b|template\s*<)")
MIN_PRELUDE = 5  # fewer lines are shown inline, not folded
FORMATTER = HtmlFormatter(nowrap=True, classprefix="hl-")


@dataclass(frozen=True)
class SplitSource:
    """A source as its prelude (possibly empty) and the rest, from the kernel on."""

    prelude: str
    kernel: str

    @property
    def prelude_lines(self) -> int:
        """Lines in the prelude."""
        return len(self.prelude.splitlines())


def split_prelude(source: str) -> SplitSource:
    """Split a kernel source where the kernel starts: at the recipes' marker line, else at the first kernel or
    entry definition; no split when the prelude would be under MIN_PRELUDE lines."""
    lines = source.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(MARKER)), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if KERNEL_START.match(line)), None)
        while start and lines[start - 1].lstrip().startswith(("//", "#", "/*", "*")) and not lines[
                start - 1].lstrip().startswith(("#include", "#define", "#if", "#endif", "#else", "import")):
            start -= 1  # the kernel's own comment
    if start is None or start < MIN_PRELUDE:
        return SplitSource("", source)
    return SplitSource("".join(lines[:start]), "".join(lines[start:]))


def highlight(source: str, backend: str) -> Markup:
    """The source as highlighted HTML spans (escaped by Pygments) for a <pre>; plain escaped text without a lexer."""
    try:
        lexer = get_lexer_by_name(LEXERS.get(backend, backend), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return Markup.escape(source)
    return Markup(_pygments(source, lexer, FORMATTER))


def stylesheet() -> str:
    """The CSS for highlighted sources (classes under pre.code)."""
    return "\n".join(line for line in FORMATTER.get_style_defs("pre.code").splitlines() if line.startswith("pre.code"))
