"""Small inline SVG charts (no JavaScript, no network): bars, stacked bars, step lines, timing ranges.

Every label is escaped with markupsafe (Jinja2's escaping); the charts are `Markup` to drop into templates.
Axis values are written short (125k, 1.5M) so that a label fits its margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d", "#bab0ac",
           "#ff9da6")
GREY = "#bab0ac"
FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def si(v: float) -> str:
    """An axis value, short: 0.5, 12, 2500, 12.5k, 125k, 1.5M (a suffix from 10 000 on)."""
    a = abs(v)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= max(scale, 1e4):
            return f"{v / scale:.4g}{suffix}"
    return f"{v:.4g}"


def short(v: float) -> str:
    """A measured value for a label: 2 decimals below 10 000, else 4 digits with a suffix (83.33k)."""
    return f"{v:.2f}" if abs(v) < 1e4 else si(float(f"{v:.4g}"))


def _anchor(x: float, width: float, room: float = 70) -> str:
    """Where a label centred at x would run past either edge, anchor it inside."""
    return "start" if x < room else "end" if x > width - room else "middle"


def colour(name: str, names: Sequence[str]) -> str:
    """A stable colour for name among names ("other" is grey)."""
    if name == "other":
        return GREY
    return PALETTE[list(names).index(name) % len(PALETTE)] if name in names else GREY


def _svg(width: int, height: int, title: str, body: list[str]) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" {FONT}>'
            f"<title>{escape(title)}</title>{''.join(body)}</svg>")  # every label in body is escaped


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    first, last = math.floor(lo / step) * step, math.ceil(hi / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(round((last - first) / step) + 1)]


def hbars(rows: Sequence[tuple[str, float]], unit: str, title: str, width: int = 640) -> Markup:
    """One horizontal bar per (label, value)."""
    left, right, bar, gap = 120, 90, 22, 10
    height = 10 + len(rows) * (bar + gap)
    top = max((v for _, v in rows), default=1.0) or 1.0
    body = []
    for i, (label, value) in enumerate(rows):
        y = 5 + i * (bar + gap)
        w = (width - left - right) * value / top
        body.append(f'<text x="{left - 8}" y="{y + bar / 2 + 4}" text-anchor="end">{escape(label)}</text>'
                    f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar}" fill="{PALETTE[i % 2]}"/>'
                    f'<text x="{left + w + 6:.1f}" y="{y + bar / 2 + 4}">{value:.3f} {escape(unit)}</text>')
    return _svg(width, height, title, body)


def stacked(rows: Sequence[tuple[str, Sequence[tuple[str, float]]]], unit: str, title: str, width: int = 640) -> Markup:
    """One horizontal bar per row, split into (segment, value) parts, with a legend of the segments."""
    left, right, bar, gap = 120, 90, 26, 12
    names = list(dict.fromkeys(seg for _, parts in rows for seg, _ in parts))
    legend_rows = math.ceil(len(names) / 4)
    height = 10 + len(rows) * (bar + gap) + legend_rows * 20 + 6
    top = max((sum(v for _, v in parts) for _, parts in rows), default=1.0) or 1.0
    scale = (width - left - right) / top
    body = []
    for i, (label, parts) in enumerate(rows):
        y = 5 + i * (bar + gap)
        x = float(left)
        body.append(f'<text x="{left - 8}" y="{y + bar / 2 + 4}" text-anchor="end">{escape(label)}</text>')
        for seg, value in parts:
            w = value * scale
            body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colour(seg, names)}">'
                        f"<title>{escape(seg)}: {value:.3f} {escape(unit)}</title></rect>")
            x += w
        total = sum(v for _, v in parts)
        body.append(f'<text x="{x + 6:.1f}" y="{y + bar / 2 + 4}">{total:.3f} {escape(unit)}</text>')
    y0 = 10 + len(rows) * (bar + gap)
    for j, seg in enumerate(names):
        x, y = left + (j % 4) * ((width - left) // 4), y0 + (j // 4) * 20
        body.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour(seg, names)}"/>'
                    f'<text x="{x + 16}" y="{y + 10}">{escape(seg)}</text>')
    return _svg(width, height, title, body)


Points = Sequence[tuple[float, float | None]]


def step_lines(series: Sequence[tuple[str, Sequence[float | None]]], title: str, xlabel: str, ylabel: str,
               width: int = 640, height: int = 280, decided: Sequence[str] = ()) -> Markup:
    """Step lines of y against 1..n per series (None: no value yet), with a dashed line at y = 1; the last point
    of each series named in `decided` is drawn as a ring (a decision, not one more measurement)."""
    n = max((len(ys) for _, ys in series), default=1) or 1
    xy = [(name, [(float(i), v) for i, v in enumerate(ys, 1)]) for name, ys in series]
    xt = [t for t in _ticks(1, n, min(n, 8)) if float(t).is_integer() and 1 <= t <= n]
    return _steps(xy, (1.0, float(n)), xt, lambda x: str(int(x)), lambda x: f"after {int(x)}", title, xlabel,
                  ylabel, width, height, decided)


def step_xy(series: Sequence[tuple[str, Points]], title: str, xlabel: str, ylabel: str, unit: str = "s",
            width: int = 640, height: int = 280, decided: Sequence[str] = ()) -> Markup:
    """Step lines of y against a numeric x from 0 (each series' points in x order), as step_lines."""
    hi = max((x for _, pts in series for x, _ in pts), default=1.0) or 1.0
    xt = _ticks(0.0, hi)
    return _steps(series, (0.0, xt[-1]), xt, si, lambda x: f"at {short(x)} {unit}", title, xlabel, ylabel, width,
                  height, decided)


def _steps(series: Sequence[tuple[str, Points]], xr: tuple[float, float], xt: Sequence[float],
           xfmt: Callable[[float], str], at: Callable[[float], str], title: str, xlabel: str, ylabel: str,
           width: int, height: int, decided: Sequence[str]) -> Markup:
    left, right, top, bottom = 56, 24, 12, 44  # right: half of the last x label
    names = [name for name, _ in series]
    legend_rows = math.ceil(len(names) / 3)
    height += legend_rows * 18
    values = [v for _, pts in series for _, v in pts if v is not None] + [1.0]
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo or 1.0)
    yt = _ticks(max(0.0, lo - pad), hi + pad)
    ylo, yhi = yt[0], yt[-1]
    pw, ph = width - left - right, height - top - bottom - legend_rows * 18

    def px(x: float) -> float:
        return left + pw * (x - xr[0]) / ((xr[1] - xr[0]) or 1.0)

    def py(v: float) -> float:
        return top + ph * (1 - (v - ylo) / ((yhi - ylo) or 1.0))

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>']
    for t in yt:
        body.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
                    f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{si(t)}</text>')
    for t in xt:
        body.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{escape(xfmt(t))}</text>')
    body.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(1.0):.1f}" y2="{py(1.0):.1f}" stroke="#888" '
                f'stroke-dasharray="4 3"/>'
                f'<text x="{left + pw / 2}" y="{top + ph + 34}" text-anchor="middle">{escape(xlabel)}</text>'
                f'<text x="14" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {top + ph / 2})">'
                f"{escape(ylabel)}</text>")
    for name, pts in series:
        body += _series(name, pts, colour(name, names), px, py, at, name in decided)
    y0 = height - legend_rows * 18 - 4
    for j, name in enumerate(names):
        x, y = left + (j % 3) * (pw // 3), y0 + (j // 3) * 18
        body.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour(name, names)}"/>'
                    f'<text x="{x + 16}" y="{y + 10}">{escape(name)}</text>')
    return _svg(width, height, title, body)


def _series(name: str, pts: Points, c: str, px: Callable[[float], float], py: Callable[[float], float],
            at: Callable[[float], str], decided: bool) -> list[str]:
    """One series: its step line, a dot per value and, where decided, a ring on the last."""
    line: list[tuple[float, float]] = []
    for x, v in pts:
        if v is None:
            continue
        if line:
            line.append((px(x), line[-1][1]))
        line.append((px(x), py(v)))
    out = []
    if line:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in line)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
    last = len(pts) - 1 if pts and pts[-1][1] is not None else -1
    for k, (x, v) in enumerate(pts):
        if v is None:
            continue
        if decided and k == last:
            out.append(f'<circle class="decided" cx="{px(x):.1f}" cy="{py(v):.1f}" r="6" fill="#fff" stroke="{c}" '
                       f'stroke-width="3"><title>{escape(name)}: {v:.2f}x {escape(at(x))}, decided (timed again)'
                       f"</title></circle>")
        else:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="3" fill="{c}">'
                       f"<title>{escape(name)}: {v:.2f}x {escape(at(x))}</title></circle>")
    return out


def ranges(rows: Sequence[tuple[str, dict[str, float]]], unit: str, title: str, width: int = 640) -> Markup:
    """Timing distributions: per row a p10..p90 box, the median as a bar, the mean as a dot."""
    left, right, bar, gap = 90, 36, 22, 26  # right: half of the last tick's label
    height = 10 + len(rows) * (bar + gap) + 20
    vals = [v for _, d in rows for k, v in d.items() if k in ("p10", "p90", "median", "mean") and v is not None]
    hi = _ticks(0.0, max(vals, default=1.0) * 1.02 or 1.0)[-1]
    pw = width - left - right

    def px(v: float) -> float:
        return left + pw * v / hi

    body = []
    for t in _ticks(0.0, hi):
        body.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="5" y2="{height - 24}" stroke="#eee"/>'
                    f'<text x="{px(t):.1f}" y="{height - 8}" text-anchor="middle">{si(t)}</text>')
    for i, (label, d) in enumerate(rows):
        y = 5 + i * (bar + gap)
        c = PALETTE[i % len(PALETTE)]
        body.append(f'<text x="{left - 8}" y="{y + bar / 2 + 4}" text-anchor="end">{escape(label)}</text>')
        if d.get("p10") is not None and d.get("p90") is not None:
            body.append(f'<rect x="{px(d["p10"]):.1f}" y="{y}" width="{px(d["p90"]) - px(d["p10"]):.1f}" '
                        f'height="{bar}" fill="{c}" fill-opacity="0.35" stroke="{c}">'
                        f'<title>p10 {d["p10"]:.2f} .. p90 {d["p90"]:.2f} {escape(unit)}</title></rect>')
        if d.get("median") is not None:
            body.append(f'<line x1="{px(d["median"]):.1f}" x2="{px(d["median"]):.1f}" y1="{y - 3}" '
                        f'y2="{y + bar + 3}" stroke="{c}" stroke-width="3"/>'
                        f'<text x="{px(d["median"]):.1f}" y="{y + bar + 15}" '
                        f'text-anchor="{_anchor(px(d["median"]), width)}">'
                        f'median {short(d["median"])} {escape(unit)}</text>')
        if d.get("mean") is not None:
            body.append(f'<circle cx="{px(d["mean"]):.1f}" cy="{y + bar / 2}" r="4" fill="#333">'
                        f'<title>mean {d["mean"]:.2f} {escape(unit)}</title></circle>')
    return _svg(width, height, title, body)
