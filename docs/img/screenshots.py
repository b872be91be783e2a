"""Regenerate the README's screenshots of forge ui's task page and of the HTML report.

    .venv/bin/python docs/img/screenshots.py [--db PATH] [--budget 12]

Without --db it runs `forge optimize examples/rmsnorm_swiglu.py --budget 12` into a temporary store first.
Then it serves that store with `forge ui` on a free port of 127.0.0.1, opens the searched task with the
most candidates in Debian's chromium (Playwright), clicks its best node, and saves docs/img/ui-task.png;
`forge report --html` of the same run is saved as docs/img/report.png.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forge(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "forge.cli", *args], cwd=cwd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="an existing store (default: run a search into a temporary one)")
    parser.add_argument("--budget", default="12")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forge-shots-"))
    db = Path(args.db).resolve() if args.db else work / "forge.db"
    if not args.db:
        forge("optimize", str(ROOT / "examples" / "rmsnorm_swiglu.py"), "--budget", args.budget, "--db", str(db),
              cwd=work)
    forge("report", "last", "--db", str(db), "--html", str(work / "report.html"), cwd=work)

    from forge.review.data import find_run, run_view
    from forge.store import Store

    store = Store(db)
    view = run_view(store, find_run(store, "last"))
    task = max(view.tasks, key=lambda t: (t.tried, t.task.share or 0.0))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "forge.cli", "ui", "--db", str(db), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/api/runs", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1360, "height": 1500})
            page.goto(f"{url}/runs/{view.run.id}/tasks/{task.task.id}")
            page.click(f"#tree .node[data-id='{task.best_id or task.nodes[-1].cand.id}']")
            page.wait_for_selector("#panel .node")
            page.screenshot(path=str(IMG / "ui-task.png"))
            page.set_viewport_size({"width": 1360, "height": 800})  # the report is taken whole
            page.goto((work / "report.html").as_uri())
            page.screenshot(path=str(IMG / "report.png"), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    print(f"wrote {IMG / 'ui-task.png'} and {IMG / 'report.png'} from run {view.run.id} ({db})")


if __name__ == "__main__":
    main()
