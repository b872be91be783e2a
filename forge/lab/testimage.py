"""The lab's test image: the photograph that ships inside scikit-image's wheel (skimage/data/astronaut.png, from
NASA's Great Images, public domain, 512 x 512 RGB) when scikit-image is installed (`pip install
'forge-kernels[lab-image]'`), else one drawn with PIL (no download, no licence): a sky gradient, a sun, hills, a
checkerboard, stripes of rising frequency (what resizing aliases) and coloured shapes with sharp edges (what
filters blur or find).

scikit-image is not imported (it pulls in SciPy): its package folder is found with importlib and the PNG read
with PIL.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)
SIZE = 256
PACKAGED = ("skimage", "data/astronaut.png")  # (package, file in it)


def packaged_path(package: str = PACKAGED[0], name: str = PACKAGED[1]) -> Path | None:
    """The packaged photograph's file if that package is installed and ships it (nothing is imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / name
        if path.is_file():
            return path
    return None


def _drawn() -> bytes:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (SIZE, SIZE))
    d = ImageDraw.Draw(im)
    for y in range(SIZE // 2):  # sky: blue to pale
        t = y / (SIZE / 2)
        d.line([(0, y), (SIZE, y)], fill=(int(70 + 150 * t), int(130 + 100 * t), int(230 - 20 * t)))
    d.ellipse([170, 20, 220, 70], fill=(255, 214, 60))
    d.polygon([(0, 150), (60, 95), (130, 150)], fill=(60, 140, 70))
    d.polygon([(90, 150), (170, 80), (256, 150)], fill=(40, 110, 60))
    for y in range(150, SIZE, 16):  # a checkerboard floor
        for x in range(0, SIZE, 16):
            shade = 230 if (x // 16 + y // 16) % 2 else 40
            d.rectangle([x, y, x + 15, y + 15], fill=(shade, shade, shade))
    for i in range(24):  # stripes, finer to the right
        x = 8 + i * (i + 4) // 3
        d.line([(x, 100), (x, 140)], fill=(250, 250, 250), width=1)
    d.rectangle([20, 20, 70, 70], fill=(220, 40, 40))
    d.ellipse([90, 30, 140, 80], outline=(20, 20, 20), width=4)
    return im.tobytes()


@functools.cache
def _pixels() -> tuple[bytes, str]:
    """SIZE x SIZE RGB bytes and where they come from."""
    from PIL import Image, UnidentifiedImageError

    path = packaged_path()
    if path is not None:
        try:
            with Image.open(path) as im:
                rgb = im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.LANCZOS)
            return rgb.tobytes(), f"{path.parent.parent.name}/{path.parent.name}/{path.name} (scikit-image)"
        except (OSError, UnidentifiedImageError) as e:
            log.warning("cannot read the packaged test image %s (%s): drawing one", path, e)
    return _drawn(), "drawn with PIL"


def source() -> str:
    """Where the test image comes from (the kernel pages say it)."""
    return _pixels()[1]


def test_image() -> torch.Tensor:
    """The test image as (1, 3, 256, 256) float32 in [0, 1] (a new tensor each call)."""
    t = torch.frombuffer(bytearray(_pixels()[0]), dtype=torch.uint8).view(SIZE, SIZE, 3)
    return t.permute(2, 0, 1).unsqueeze(0).float() / 255.0
