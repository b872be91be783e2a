"""The lab's catalogue: what an entry is (a function of tensors, the kind of inputs it runs on, the picture
that shows what it does), the 15 families, and lookups. The entries themselves are in forge.lab.entries.

An entry is forge-generated when its function captures to one task that the recipe policy writes a kernel
for; otherwise it runs through the vendor (eager PyTorch) path and says so. Which one is found by
lowering it (forge.lab.kernels), not declared here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.lab.inputs import MAKERS, Maker
from forge.tasks.ops import FAMILIES

TITLES: dict[str, str] = {
    "arithmetic": "arithmetic & trigonometry",
    "activation": "activations",
    "convolution/pooling": "convolution & pooling",
    "matmul": "matrix products",
    "normalization": "normalization",
    "attention": "attention & transformer blocks",
    "quantization": "quantization & type conversion",
    "reduction": "reduction & statistics",
    "logic": "logic & comparison",
    "shape": "shape & tensor plumbing",
    "resize/sampling": "resizing & sampling",
    "signal": "signal (DFT/STFT)",
    "sequence/control": "sequence & control",
    "scan": "scans & recurrences",
    "other": "other",
}
assert tuple(TITLES) == FAMILIES

# The picture each kind of input is shown with (an entry may choose another).
PICTURES = {"curve": "curve", "curve2": "curve", "image": "image", "gray": "mask", "matrix": "heatmap",
            "rows": "histogram", "rows2": "heatmap", "scores": "heatmap", "attention": "heatmap",
            "signal": "spectrum", "series": "series"}


@dataclass(frozen=True)
class Param:
    """The entry's one parameter: a literal of its function (a slope, a threshold) or, for two-input curves,
    the second input's value."""

    name: str
    default: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Entry:
    """One kernel of the gallery: `fn(*inputs, p=parameter)` over the maker's inputs."""

    slug: str
    family: str
    title: str
    fn: Callable[..., Any]
    maker: str
    param: Param | None = None
    lo: float = -4.0  # the default input range (curves)
    hi: float = 4.0
    picture: str = ""  # default: the maker's (PICTURES)

    def __post_init__(self) -> None:
        if self.family not in TITLES:
            raise ValueError(f"Invalid family {self.family!r} of {self.slug}")
        if self.maker not in MAKERS:
            raise ValueError(f"Invalid maker {self.maker!r} of {self.slug}")
        if not self.picture:
            object.__setattr__(self, "picture", PICTURES[self.maker])

    @property
    def inputs(self) -> Maker:
        """The kind of inputs it runs on."""
        return MAKERS[self.maker]

    @property
    def param_bounds(self) -> tuple[float, float, float] | None:
        """(default, lo, hi) of the parameter, or None."""
        return None if self.param is None else (self.param.default, self.param.lo, self.param.hi)


def catalogue() -> dict[str, Entry]:
    """Every entry by slug, in family order."""
    from forge.lab.entries import ENTRIES

    order = {f: i for i, f in enumerate(FAMILIES)}
    return {e.slug: e for e in sorted(ENTRIES, key=lambda e: order[e.family])}


def entry(slug: str) -> Entry:
    """One entry; KeyError if there is none of that name."""
    found = catalogue().get(slug)
    if found is None:
        raise KeyError(f"no kernel {slug!r} in the lab")
    return found
