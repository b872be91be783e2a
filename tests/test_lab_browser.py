"""forge lab in a real browser (Playwright driving Debian's chromium): a kernel of each of the 15 families
opened from the gallery, run on the device (CPU here) through `forge lab`'s real server and worker, its
picture and numbers shown; bad input shows its message and the page runs again after.

Skipped only where chromium or the playwright package is absent (`sh .ci/browser.sh` installs chromium).
"""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from review_store import ROOT, free_port

from forge.lab.catalogue import TITLES, entry

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed ('.[dev]')")

# One kernel per family: forge-generated where forge writes that family, the vendor path elsewhere.
ONE_PER_FAMILY = {"arithmetic": "sin", "activation": "gelu", "convolution/pooling": "sobel", "matmul": "matmul",
                  "normalization": "group-norm-3", "attention": "scaled-masked-softmax",
                  "quantization": "to-bfloat16", "reduction": "sum-rows", "logic": "greater", "shape": "transpose",
                  "resize/sampling": "bilinear-up", "signal": "rfft", "sequence/control": "cumsum",
                  "scan": "chunked-decay-sum", "other": "lerp"}
FORGE = {"sin", "gelu", "group-norm-3", "scaled-masked-softmax", "to-bfloat16", "sum-rows", "greater",
         "transpose", "lerp"}


def _serve(tmp: Path, db: Path):
    """`forge lab` on a free port over `db`; yields its URL, stops it after."""
    port = free_port()
    log = (tmp / "lab.log").open("w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "lab", "--port", str(port), "--cache", str(tmp / "c"),
                             "--db", str(db)], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"forge lab did not answer: {(tmp / 'lab.log').read_text()}") from None
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    yield from _serve(tmp, tmp / "none.db")


@pytest.fixture(scope="module")
def lab_with_runs(rs, tmp_path_factory):
    """The lab over the store of a real search (conftest's `rs`): its kernels have pages."""
    yield from _serve(tmp_path_factory.mktemp("labruns"), rs.db)


@pytest.fixture(scope="module")
def page(lab):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM))
        pg = b.new_page(viewport={"width": 1360, "height": 900})
        pg.outside = []
        pg.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1:", "data:"))
              else pg.outside.append(r.url))
        yield pg
        b.close()


def test_one_per_family_covers_all_15():
    assert set(ONE_PER_FAMILY) == set(TITLES)
    assert all(entry(s).family == f for f, s in ONE_PER_FAMILY.items())


@pytest.mark.parametrize("family", list(ONE_PER_FAMILY))
def test_run_a_kernel_of_each_family(lab, page, family):
    slug = ONE_PER_FAMILY[family]
    page.goto(lab + "/")
    page.click(f"section[data-family='{family}'] a[data-slug='{slug}']")
    page.wait_for_selector("#run-form")
    page.click("#run")
    page.wait_for_selector("#pictures img", timeout=240_000)
    imgs = page.locator("#pictures img")
    assert imgs.count() >= 1
    for i in range(imgs.count()):  # every picture decoded and laid out by the browser
        assert page.evaluate("(img) => img.complete && img.naturalWidth > 0", imgs.nth(i).element_handle())
    path = page.text_content("#path")
    assert ("forge-generated" in path) is (slug in FORGE), (slug, path, page.text_content("#why"))
    assert page.text_content("#max-error") not in ("", "—")
    assert page.text_content("#eager-time").endswith("s")
    if slug in FORGE:
        assert page.text_content("#time").endswith("s") and page.text_content("#speedup").endswith("x")
        assert "forge_launch" in page.text_content("#kernel-source")
        assert "=" in page.text_content("#knobs")  # the schedule that ran
    assert page.is_hidden("#error") and not page.outside


def test_bad_input_shows_a_message_and_the_page_goes_on(lab, page, tmp_path):
    page.goto(lab + "/kernels/gelu")
    page.fill("input[name=n]", "999999999")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    assert "Invalid size 'n'" in page.text_content("#error")
    page.goto(lab + "/kernels/group-norm-3")
    bad = tmp_path / "not-an-image.png"
    bad.write_text("this is text")
    page.set_input_files("input[name=image]", str(bad))
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    assert "Invalid image" in page.text_content("#error")
    page.set_input_files("input[name=image]", [])
    page.fill("input[name=size]", "32")
    page.click("#run")  # the server went on
    page.wait_for_selector("#pictures img", timeout=240_000)
    assert page.is_hidden("#error")


def test_a_kernel_found_by_a_run_has_a_page_in_its_family_that_runs_it(lab_with_runs, page):
    page.goto(lab_with_runs + "/")
    card = page.locator("a.card.found").first
    family = card.evaluate("(a) => a.closest('section').dataset.family")
    assert family in TITLES
    card.click()
    page.wait_for_selector("#run-form")
    assert "/runs/" in page.get_attribute("#tree", "href")  # its search tree in forge ui
    page.click("#run")
    page.wait_for_selector("#pictures img", timeout=240_000)
    assert "forge-generated" in page.text_content("#path")
    assert page.text_content("#time").endswith("s") and page.text_content("#speedup").endswith("x")
    assert page.text_content("#max-error") not in ("", "—") and "forge_launch" in page.text_content("#kernel-source")
    assert page.is_hidden("#error") and not page.outside
