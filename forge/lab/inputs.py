"""What a person sets on a kernel's page (sizes, a parameter, a range, an image), validated, and the input
tensors each kind of kernel is run on.

Every kind of input (a "maker") names its sizes with their bounds; `parse_settings` turns the page's raw
values into `Settings` or raises ValueError with a one-line message the page shows (an absurd size, a
value that is not a number, an image that is not one). Inputs are deterministic for given settings, so a
run can be repeated and compared.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import torch

from forge.lab.testimage import test_image

MAX_ELEMENTS = 1 << 22  # per input tensor: what a live run on a shared machine may ask for
MAX_IMAGE_BYTES = 8 << 20


@dataclass(frozen=True)
class Size:
    """One size a person may set: its default and bounds."""

    name: str
    default: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Maker:
    """A kind of input: its sizes and whether it reads an image, a range and a parameter."""

    name: str
    sizes: tuple[Size, ...]
    image: bool = False
    ranged: bool = False  # inputs over [lo, hi]


MAKERS: dict[str, Maker] = {m.name: m for m in (
    Maker("curve", (Size("n", 512, 2, 1 << 20),), ranged=True),
    Maker("curve2", (Size("n", 512, 2, 1 << 20),), ranged=True),  # x over the range, y = the parameter
    Maker("image", (Size("size", 128, 8, 1024),), image=True),
    Maker("gray", (Size("size", 128, 8, 1024),), image=True),
    Maker("matrix", (Size("m", 48, 1, 2048), Size("k", 64, 1, 2048), Size("n", 40, 1, 2048))),
    Maker("rows", (Size("rows", 64, 1, 4096), Size("cols", 256, 1, 1 << 16))),
    Maker("rows2", (Size("rows", 32, 1, 4096), Size("cols", 128, 1, 1 << 16))),
    Maker("scores", (Size("length", 48, 2, 1024),)),
    Maker("attention", (Size("length", 48, 2, 1024), Size("dim", 32, 1, 256))),
    Maker("signal", (Size("n", 512, 16, 1 << 20),)),
    Maker("series", (Size("n", 200, 2, 1 << 20),)),
)}


@dataclass(frozen=True)
class Settings:
    """A run's settings: sizes by name, the parameter, the range; the image (1, 3, H, W in [0, 1]) if any."""

    sizes: tuple[tuple[str, int], ...]
    param: float = 0.0
    lo: float = -4.0
    hi: float = 4.0
    image: torch.Tensor | None = field(default=None, compare=False, hash=False)

    def size(self, name: str) -> int:
        """One size by name."""
        return dict(self.sizes)[name]


def _number(raw: object, what: str) -> float:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"Invalid {what}: {raw!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"Invalid {what}: {raw!r} is not finite")
    return v


def parse_settings(maker: Maker, raw: dict[str, object], param: tuple[float, float, float] | None,
                   lo_hi: tuple[float, float]) -> Settings:
    """Settings from the page's values (missing ones take their defaults); ValueError with the reason.

    `param`: (default, lo, hi) of the kernel's parameter, None without one; `lo_hi`: the default range.
    """
    sizes = []
    for s in maker.sizes:
        v = raw.get(s.name, s.default)
        f = _number(v, f"size {s.name!r}")
        if f != int(f) or not s.lo <= f <= s.hi:
            raise ValueError(f"Invalid size {s.name!r}: {v!r} (a whole number from {s.lo} to {s.hi})")
        sizes.append((s.name, int(f)))
    p = 0.0
    if param is not None:
        p = _number(raw.get("param", param[0]), "parameter")
        if not param[1] <= p <= param[2]:
            raise ValueError(f"Invalid parameter: {p:g} (from {param[1]:g} to {param[2]:g})")
    lo, hi = parse_range(raw, lo_hi) if maker.ranged else lo_hi
    settings = Settings(tuple(sizes), p, lo, hi)
    biggest = max((math.prod(shape) for shape in shapes(maker, settings)), default=0)
    if biggest > MAX_ELEMENTS:
        raise ValueError(f"Invalid sizes: {biggest} elements in one input (at most {MAX_ELEMENTS})")
    return settings


def parse_range(raw: dict[str, object], lo_hi: tuple[float, float]) -> tuple[float, float]:
    """The input range from the page's "lo" and "hi" (defaults: `lo_hi`); ValueError with the reason."""
    lo, hi = _number(raw.get("lo", lo_hi[0]), "range start"), _number(raw.get("hi", lo_hi[1]), "range end")
    if not (lo < hi and abs(lo) <= 1e6 and abs(hi) <= 1e6):
        raise ValueError(f"Invalid range: [{lo:g}, {hi:g}] (start below end, within +-1e6)")
    return lo, hi


def read_image(data: bytes) -> torch.Tensor:
    """An uploaded image as (1, 3, H, W) float32 in [0, 1]; ValueError if it is not an image PIL reads."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"Invalid image: {len(data)} bytes (at most {MAX_IMAGE_BYTES})")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > 64 << 20:
                raise ValueError(f"Invalid image: {im.width}x{im.height} pixels is too many")
            rgb = im.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"Invalid image: not a picture PIL can read ({type(e).__name__})") from None
    t = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(rgb.height, rgb.width, 3)
    return t.permute(2, 0, 1).unsqueeze(0).float() / 255.0


def shapes(maker: Maker, s: Settings) -> list[tuple[int, ...]]:
    """The shapes of the maker's inputs for these settings."""
    g = dict(s.sizes)
    return {
        "curve": lambda: [(g.get("n", 0),)],
        "curve2": lambda: [(g.get("n", 0),)] * 2,
        "image": lambda: [(1, 3, g.get("size", 0), g.get("size", 0))],
        "gray": lambda: [(g.get("size", 0), g.get("size", 0))] * 2,
        "matrix": lambda: [(g.get("m", 0), g.get("k", 0)), (g.get("k", 0), g.get("n", 0))],
        "rows": lambda: [(g.get("rows", 0), g.get("cols", 0))],
        "rows2": lambda: [(g.get("rows", 0), g.get("cols", 0))] * 2,
        "scores": lambda: [(g.get("length", 0),) * 2] * 2,
        "attention": lambda: [(1, 2, g.get("length", 0), g.get("dim", 0))] * 3,
        "signal": lambda: [(g.get("n", 0),)],
        "series": lambda: [(g.get("n", 0),)],
    }[maker.name]()


def _image(s: Settings) -> torch.Tensor:
    """The settings' image (or the test image) resized to size x size."""
    n = s.size("size")
    img = s.image if s.image is not None else test_image()
    return torch.nn.functional.interpolate(img, size=(n, n), mode="bilinear", antialias=True,
                                           align_corners=False).clamp(0, 1).contiguous()


def make(maker: Maker, s: Settings) -> list[torch.Tensor]:
    """The input tensors (float32, CPU) for these settings."""
    gen = torch.Generator().manual_seed(0)
    name = maker.name
    if name in ("curve", "curve2"):
        x = torch.linspace(s.lo, s.hi, s.size("n"))
        return [x] if name == "curve" else [x, torch.full_like(x, s.param)]
    if name == "image":
        return [_image(s)]
    if name == "gray":
        g = _image(s).mean(1)[0]  # the image's brightness, and the same mirrored: two fields to compare
        return [g.contiguous(), g.flip(1).contiguous()]
    if name == "matrix":
        m, k, n = s.size("m"), s.size("k"), s.size("n")
        a = torch.sin(torch.arange(m)[:, None] / 5.0) + 0.3 * torch.randn(m, k, generator=gen)
        b = torch.cos(torch.arange(n)[None, :] / 7.0) + 0.3 * torch.randn(k, n, generator=gen)
        return [a.contiguous(), b.contiguous()]
    if name in ("rows", "rows2"):
        shape = (s.size("rows"), s.size("cols"))
        xs = [torch.randn(shape, generator=gen) * (1 + torch.arange(shape[0])[:, None] / shape[0])]
        return xs + ([torch.randn(shape, generator=gen)] if name == "rows2" else [])
    if name == "scores":
        n = s.size("length")
        causal = torch.full((n, n), -1e4).triu(1)  # an additive causal mask
        return [torch.randn(n, n, generator=gen) * 2, causal]
    if name == "attention":
        shape = (1, 2, s.size("length"), s.size("dim"))
        return [torch.randn(shape, generator=gen) for _ in range(3)]
    if name == "signal":
        t = torch.arange(s.size("n")) / s.size("n")
        f = max(1.0, s.param or 24.0)
        x = torch.sin(2 * math.pi * f * t) + 0.5 * torch.sin(2 * math.pi * 3.3 * f * t)
        return [x + 0.2 * torch.randn(x.shape, generator=gen)]
    if name == "series":
        return [torch.randn(s.size("n"), generator=gen)]
    raise ValueError(f"Invalid maker: {name!r}")
