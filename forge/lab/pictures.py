"""Pictures of what a kernel did, drawn on the server: SVG line and bar charts (curves, histograms, spectra,
series) and PNG images (images before and after, heatmaps, masks). Each is a `Picture` the page shows as an
<img> from a data URI, so no script draws and nothing is fetched.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from html import escape

import torch

W, H, PAD = 560, 300, 44
MAX_POINTS = 2000  # a curve is drawn from at most this many points (evenly picked)
MAX_PIXELS = 512  # the longer side of a PNG


@dataclass(frozen=True)
class Picture:
    """One picture: a caption and its data URI."""

    title: str
    uri: str


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _svg_uri(body: list[str], title: str) -> str:
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="sans-serif" font-size="11"><title>{escape(title)}</title>'
           f'<rect width="{W}" height="{H}" fill="white"/>' + "".join(body) + "</svg>")
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _finite(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().double().flatten()
    return t[torch.isfinite(t)]


def lines(series: list[tuple[str, torch.Tensor, torch.Tensor, str]], title: str) -> Picture:
    """A line chart of (name, x, y, colour) series, axes from their finite values."""
    xs = torch.cat([_finite(x) for _, x, _, _ in series] or [torch.zeros(1)])
    ys = torch.cat([_finite(y) for _, _, y, _ in series] or [torch.zeros(1)])
    xs = xs if xs.numel() else torch.zeros(1)
    ys = ys if ys.numel() else torch.zeros(1)
    x0, x1 = float(xs.min()), float(xs.max())
    y0, y1 = float(ys.min()), float(ys.max())
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def px(v: float) -> float:
        return PAD + (v - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(v: float) -> float:
        return H - PAD - (v - y0) / (y1 - y0) * (H - 2 * PAD)

    body = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#888"/>',
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#888"/>',
            f'<text x="{PAD}" y="{H - PAD + 16}">{_fmt(x0)}</text>',
            f'<text x="{W - PAD}" y="{H - PAD + 16}" text-anchor="end">{_fmt(x1)}</text>',
            f'<text x="{PAD - 4}" y="{H - PAD}" text-anchor="end">{_fmt(y0)}</text>',
            f'<text x="{PAD - 4}" y="{PAD + 4}" text-anchor="end">{_fmt(y1)}</text>']
    for i, (name, x, y, colour) in enumerate(series):
        x, y = x.detach().double().flatten(), y.detach().double().flatten()
        step = max(1, x.numel() // MAX_POINTS)
        pts = [(float(a), float(b)) for a, b in zip(x[::step], y[::step], strict=False)]
        path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts if b == b and abs(b) != float("inf"))
        dash = ' stroke-dasharray="5 4"' if i else ""
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        body.append(f'<text x="{W - PAD}" y="{PAD + 14 * i}" text-anchor="end" fill="{colour}">{escape(name)}</text>')
    return Picture(title, _svg_uri(body, title))


def bars(values: torch.Tensor, title: str, bins: int = 40, colour: str = "#3b6ea5") -> Picture:
    """A histogram of the finite values."""
    v = _finite(values)
    if not v.numel():
        v = torch.zeros(1, dtype=torch.float64)
    lo, hi = float(v.min()), float(v.max())
    hi = hi if hi > lo else lo + 1
    counts = torch.histc(v, bins, lo, hi)
    top = float(counts.max()) or 1.0
    bw = (W - 2 * PAD) / bins
    body = [f'<rect x="{PAD + i * bw:.1f}" y="{H - PAD - c / top * (H - 2 * PAD):.1f}" width="{bw - 1:.1f}" '
            f'height="{c / top * (H - 2 * PAD):.1f}" fill="{colour}"/>' for i, c in enumerate(counts.tolist())]
    body += [f'<text x="{PAD}" y="{H - PAD + 16}">{_fmt(lo)}</text>',
             f'<text x="{W - PAD}" y="{H - PAD + 16}" text-anchor="end">{_fmt(hi)}</text>',
             f'<text x="{PAD}" y="{PAD - 8}">{int(top)} at most, {v.numel()} values</text>']
    return Picture(title, _svg_uri(body, title))


def _colormap(t: torch.Tensor) -> torch.Tensor:
    """Values in [0, 1] (H, W) as RGB (H, W, 3): blue, white, red."""
    r = (2 * t).clamp(0, 1)
    b = (2 - 2 * t).clamp(0, 1)
    g = torch.minimum(r, b)
    return torch.stack([r, g, b], -1)


def _png_uri(rgb: torch.Tensor) -> str:
    """(H, W, 3) in [0, 1], or (H, W) gray, as a PNG data URI (nearest-scaled so small ones are seen)."""
    from PIL import Image

    arr = (rgb.clamp(0, 1) * 255).round().to(torch.uint8).contiguous()
    mode = "RGB" if arr.dim() == 3 else "L"
    im = Image.frombytes(mode, (arr.shape[1], arr.shape[0]), arr.numpy().tobytes())
    side = max(im.width, im.height)
    scale = MAX_PIXELS / side if side > MAX_PIXELS else max(1, 256 // side)
    if scale != 1:
        im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.NEAREST)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _unit(t: torch.Tensor) -> torch.Tensor:
    """Min-max scaled to [0, 1] (non-finite values as 0)."""
    t = t.detach().double().nan_to_num(0.0, 0.0, 0.0)
    lo, hi = float(t.min()) if t.numel() else 0.0, float(t.max()) if t.numel() else 1.0
    return (t - lo) / (hi - lo) if hi > lo else torch.zeros_like(t)


def as_image(t: torch.Tensor) -> torch.Tensor:
    """A tensor as something to show: (H, W, 3) for 3 channels first or last, else (H, W) of the first
    channel; values scaled to [0, 1] unless they already lie there."""
    t = t.detach().cpu()
    while t.dim() > 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 3 and t.shape[0] == 3:
        t = t.permute(1, 2, 0)
    elif t.dim() == 3 and t.shape[-1] != 3:
        t = t[0]
    elif t.dim() > 3:
        t = t.reshape(-1, t.shape[-2], t.shape[-1])[0]
    elif t.dim() == 1:
        t = t[None]
    t = t.double()
    if t.dtype != torch.bool and t.numel() and (float(t.min()) < 0 or float(t.max()) > 1):
        t = _unit(t)
    return t


def image(t: torch.Tensor, title: str) -> Picture:
    """A tensor shown as an image."""
    return Picture(title, _png_uri(as_image(t)))


def heatmap(t: torch.Tensor, title: str) -> Picture:
    """A tensor's last two dimensions (the first of the others) as a blue-white-red heatmap."""
    t = t.detach().cpu().double()
    t = t.reshape(-1, t.shape[-2], t.shape[-1])[0] if t.dim() >= 2 else t.reshape(1, -1)
    return Picture(title, _png_uri(_colormap(_unit(t))))


def draw(kind: str, inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...],
         eager: tuple[torch.Tensor, ...], label: str) -> list[Picture]:
    """The pictures of one run (`kind`: an entry's picture; `label`: whose outputs they are)."""
    out = outputs[0] if outputs else torch.zeros(1)
    ref = eager[0] if eager else out
    if kind == "curve":
        x = inputs[0]
        return [lines([(label, x[: out.numel()], out.flatten()[: x.numel()], "#c0392b"),
                       ("eager", x[: ref.numel()], ref.flatten()[: x.numel()], "#2c3e50")], f"{label} over x")]
    if kind == "series":
        idx = torch.arange(max(inputs[0].numel(), out.numel()))
        return [lines([("input", idx[: inputs[0].numel()], inputs[0], "#7f8c8d"),
                       (label, idx[: out.numel()], out.flatten(), "#c0392b")], "input and output by index")]
    if kind == "histogram":
        return [bars(inputs[0], "input values"), bars(out, f"{label} output values", colour="#c0392b")]
    if kind in ("spectrum", "filtered"):  # the output is a spectrum, or a signal shown by its spectrum
        x = inputs[0]
        if kind == "filtered":
            spectrum = torch.fft.rfft(out.double().flatten()).abs()
            caption = f"spectrum of the {label} output (magnitude by frequency bin)"
        else:
            spectrum, caption = out.double().flatten(), f"{label} output (magnitude by frequency bin)"
        return [lines([("signal", torch.arange(x.numel()), x, "#7f8c8d")], "input signal"),
                lines([(label, torch.arange(spectrum.numel()), spectrum, "#c0392b")], caption)]
    if kind == "mask":
        return [image(inputs[0], "input (brightness)"), image(out.double(), f"{label} mask")]
    if kind == "image":
        return [image(inputs[0], "before"), image(out, f"after ({label})")]
    if kind == "heatmap":
        return [heatmap(t, f"input {i}") for i, t in enumerate(inputs[:2])] + [heatmap(out, f"{label} output")]
    raise ValueError(f"Invalid picture kind: {kind!r}")
