"""Regenerate the README's screenshots of forge lab: the gallery and three kernel pages after a run.

    .venv/bin/python docs/img/lab_screenshots.py [--cache DIR]

Serves `forge lab` (CPU) on a free port of 127.0.0.1 with the given cache (default: a temporary one, so the
kernels shown are generated and verified first), opens it in Debian's chromium (Playwright), runs gelu,
sobel and group-norm-3, and saves docs/img/lab-gallery.png, lab-gelu.png, lab-sobel.png, lab-norm.png.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
SHOTS = {"gelu": "lab-gelu.png", "sobel": "lab-sobel.png", "group-norm-3": "lab-norm.png"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="the lab cache to serve (default: a new temporary one)")
    args = parser.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="forge-lab-")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "lab", "--port", str(port), "--cache", cache],
                            cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.3)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = b.new_page(viewport={"width": 1360, "height": 900})
            for slug, name in SHOTS.items():
                page.goto(f"{url}/kernels/{slug}")
                page.click("#run")
                page.wait_for_selector("#pictures img", timeout=300_000)
                page.screenshot(path=str(IMG / name), full_page=True)
            page.goto(url + "/")
            page.screenshot(path=str(IMG / "lab-gallery.png"))
            b.close()
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
