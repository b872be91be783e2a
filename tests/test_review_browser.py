"""forge ui and the HTML report in a real browser (Playwright driving Debian's chromium at /usr/bin/chromium).

The app is `forge ui` on 127.0.0.1 over the store of a small real search (review_store.py). Skipped only
where chromium or the playwright package is absent; `.ci/run` installs both.
"""

import time
from pathlib import Path

import pytest
from review_store import HOSTILE_SOURCE, LONG_REASON, start_ui, two_runs

from forge.cli import main
from forge.store import Store

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed ('.[dev]')")

@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM))  # Debian's chromium, not a downloaded one
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page that records dialogs (a script that ran) and requests that left the app."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.dialogs, pg.outside = [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1:", "file://", "data:"))
          else pg.outside.append(r.url))
    yield pg
    context.close()


def test_open_a_run_click_a_node_and_see_its_code(rs, ui, page, tmp_path):
    page.goto(ui.url + "/")
    page.click(f"a[href='/runs/{rs.run_id}']")
    page.wait_for_selector("h1:has-text('run')")
    assert page.locator("section svg").count() == 4  # end to end, op families, best so far (candidates, time)
    key = Store(rs.db).get_task(rs.task_id).key
    page.click(f"a:text-is('{key}')")
    page.wait_for_selector("#tree svg .node")
    store = Store(rs.db)
    best = max((c for c in store.candidates(rs.task_id) if c.status == "ok" and c.backend == "cpu"),
               key=lambda c: c.reward or -1.0)
    assert page.locator("#tree .node").count() == len(store.candidates(rs.task_id))
    page.click(f"#tree .node[data-id='{best.id}']")
    page.wait_for_selector(f"#panel .node[data-node='{best.id}']")
    prelude, code = page.text_content("#panel details.prelude pre.code"), page.inner_text("#panel pre.code.kernel")
    assert prelude + code == best.source and "forge_launch" in code and "forge recipe" in code.splitlines()[0]
    assert not page.is_visible("#panel details.prelude pre")  # folded until clicked
    page.click("#panel details.prelude summary")
    assert page.is_visible("#panel details.prelude pre") and page.locator("#panel pre.code span[class^=hl-]").count()
    panel = page.inner_text("#panel")
    assert "Diff against parent" in panel and "Build log" in panel and "Verification" in panel
    assert page.locator("#panel svg").count() == 1  # the timing distribution
    assert page.locator(f"#tree .node.selected[data-id='{best.id}']").count() == 1
    assert page.url.endswith(f"#node-{best.id}")
    shot = tmp_path / "task.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not page.dialogs and not page.outside


def test_script_in_a_candidate_renders_as_text(rs, ui, page):
    page.goto(f"{ui.url}/runs/{rs.run_id}/tasks/{rs.task_id}#node-{rs.hostile_id}")  # opens the node on load
    page.wait_for_selector(f"#panel .node[data-node='{rs.hostile_id}']")
    assert page.inner_text("#panel pre.code.kernel").strip() == HOSTILE_SOURCE.strip()
    panel = page.inner_text("#panel")
    assert "<img src=x onerror=alert(\"message\")>" in panel and "alert('log')" in panel
    assert "<script>alert('prompt')</script>" in panel and "alert('answer')" in panel
    assert "$0.0125, 1.5 s" in panel and "Code taken from the answer" in panel  # tokens, cost, latency, the code
    assert page.inner_text("#panel pre.taken").strip() == HOSTILE_SOURCE.strip()
    assert page.locator("#panel script, #panel img, #panel b, #panel i").count() == 0
    assert "build_error" in page.text_content(f"#tree .node[data-id='{rs.hostile_id}'] text")
    assert not page.dialogs and not page.outside


def test_html_report_reads_with_no_network(rs, page, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", rs.run_id, "--db", str(rs.db), "--html", str(out)]) == 0
    capsys.readouterr()
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file://") else route.abort())
    page.goto(out.as_uri())
    assert page.locator("svg").count() == 4  # end to end, op families, against candidates, against wall time
    assert all(page.locator("svg").nth(i).bounding_box()["height"] > 40 for i in range(4))
    wall = page.locator("svg[aria-label='best speedup so far against wall time']")
    assert "wall time since the run started (s)" in wall.text_content()
    for svg in page.locator("svg").all():  # every label whole, inside its chart
        frame = svg.bounding_box()
        for t in svg.locator("text").all():
            b = t.bounding_box()
            assert frame["x"] - 0.5 <= b["x"] and b["x"] + b["width"] <= frame["x"] + frame["width"] + 0.5, (
                t.text_content())
            assert frame["y"] - 0.5 <= b["y"] and b["y"] + b["height"] <= frame["y"] + frame["height"] + 0.5, (
                t.text_content())
    assert rs.run_id in page.inner_text("h1")
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 20_000
    assert not page.dialogs and not page.outside


def test_a_running_search_updates_live(page, tmp_path):
    store = Store(tmp_path / "live.db")  # what a search does as it goes: a running run gains nodes
    run = store.create_run("examples/live.py", device="cpu", dtype="fp32", policy="recipes")
    task = store.add_task(run.id, "silu-live", family="activation", ms=1.0, share=0.5, state="running")
    root = store.add_candidate(task.id, None, backend="eager", source="def region(x): ...", origin="baseline",
                               status="ok")
    ui = start_ui(tmp_path / "live.db", tmp_path / "ui.log")
    try:
        _watch_live(store, run, task, root, ui.url, page)
    finally:
        ui.stop()
    assert not page.dialogs and not page.outside


def _watch_live(store, run, task, root, url, page):
    page.goto(f"{url}/runs/{run.id}/tasks/{task.id}")
    page.wait_for_selector(f"#tree .node[data-id='{root.id}']")
    assert "updating live" in page.inner_text("#live")
    child = store.add_candidate(task.id, root.id, backend="cpu", source="int forge_launch() { return 0; }",
                                origin="recipes", status="ok", visits=1, reward=0.4)
    store.add_evaluation(child.id, status="ok", time_us_median=10.0, baseline_us_median=15.0)
    page.wait_for_selector(f"#tree .node[data-id='{child.id}']", timeout=15_000)
    assert "1.50x" in page.text_content(f"#tree .node[data-id='{child.id}'] text")
    page.wait_for_selector(f"table.nodes tr[data-id='{child.id}']")
    page.click("table.nodes th:text-is('speedup')")  # sorted (fastest first) and filtered, then refreshed live
    page.fill("#filter", "recipes")
    fast = store.add_candidate(task.id, root.id, backend="cpu", source="int forge_launch() { return 1; }",
                               origin="recipes", status="ok", visits=1, reward=2.0)
    store.add_evaluation(fast.id, status="ok", time_us_median=5.0, baseline_us_median=15.0)
    page.wait_for_selector(f"table.nodes tr[data-id='{fast.id}']", timeout=15_000)
    rows = page.locator("table.nodes tbody tr:visible")
    assert rows.count() == 2 and "3.00x" in rows.first.inner_text() and "1.50x" in rows.nth(1).inner_text()
    assert page.locator("table.nodes th.sorted-desc").inner_text() == "speedup"
    page.fill("#filter", "")

    page.goto(f"{url}/runs/{run.id}")
    assert "updating live" in page.inner_text("#live")
    store.add_task(run.id, "mean-live", family="normalization", ms=0.5, share=0.25)
    page.wait_for_selector("a:text-is('mean-live')", timeout=15_000)
    store.update_task(task.id, state="done", stop_reason="budget")
    store.update_run(run.id, state="done", eager_ms=2.0, forge_ms=1.6)
    deadline = time.monotonic() + 15
    while "updating live" in page.inner_text("#live") and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert page.inner_text("#live") == "" and "1.25x" in page.inner_text("#content")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """`forge ui` over two runs of one model (review_store.two_runs), and the runs' ids."""
    folder = tmp_path_factory.mktemp("two")
    a, b, task, slow = two_runs(folder / "two.db")
    server = start_ui(folder / "two.db", folder / "ui.log")
    yield server, a, b, task, slow
    server.stop()


def test_compare_two_runs_from_the_run_list(two, page):
    ui, a, b, _, _ = two
    page.goto(ui.url + "/")
    page.click(f"a.compare[href='/compare?a={a}&b={b}']")
    page.wait_for_selector("table.compare-tasks")
    assert a in page.inner_text("h1") and b in page.inner_text("h1")
    rows = {r.get_attribute("data-key"): r.inner_text() for r in page.locator("table.compare-tasks tbody tr").all()}
    assert set(rows) == {"silu-compare", "mean-only-b"}
    assert "1.50x" in rows["silu-compare"] and "3.00x" in rows["silu-compare"] and "2.00" in rows["silu-compare"]
    assert "not in this run" in rows["mean-only-b"]
    runs = page.inner_text("table.compare-runs")
    assert "2 of 40" in runs and "6 of 40" in runs
    page.click(f"table.compare-runs a[href='/runs/{b}']")
    page.wait_for_selector("p.compare-with")
    assert not page.dialogs and not page.outside


def test_runs_filter_and_sort(two, page):
    ui, a, b, _, _ = two
    page.goto(ui.url + "/")
    page.fill("#filter", b)
    assert page.locator("table.runs tbody tr:visible").count() == 1
    page.fill("#filter", "")
    page.click("table.runs th:text-is('speedup')")
    first = page.locator("table.runs tbody tr").first.inner_text()
    assert b in first  # the faster run first (descending)
    page.click("table.runs th:text-is('speedup')")
    assert a in page.locator("table.runs tbody tr").first.inner_text()


def test_task_nodes_sort_filter_and_open(two, page):
    ui, _, b, task, slow = two
    page.goto(f"{ui.url}/runs/{b}/tasks/{task}")
    page.wait_for_selector("#tree svg .node")
    assert page.locator("table.nodes tbody tr").count() == 4  # the eager root and three candidates
    page.click("table.nodes th:text-is('speedup')")
    rows = page.locator("table.nodes tbody tr")
    assert "3.00x" in rows.first.inner_text() and "best" in rows.first.inner_text()
    assert "eager" in rows.last.inner_text()  # no speedup: last either way
    page.click("table.nodes th:text-is('speedup')")
    assert "1.10x" in rows.first.inner_text() and "eager" in rows.last.inner_text()
    page.click("table.nodes th:text-is('node')")  # by id as a number, newest first
    ids = [int(r.get_attribute("data-id")) for r in rows.all()]
    assert ids == sorted(ids, reverse=True)
    page.fill("#filter", "chunk=0 recipes")
    visible = page.locator("table.nodes tbody tr:visible")
    assert visible.count() == 1 and visible.first.get_attribute("data-id") == str(slow)
    page.click(f"table.nodes a.node-link[data-id='{slow}']")
    page.wait_for_selector(f"#panel .node[data-node='{slow}']")
    assert page.url.endswith(f"#node-{slow}") and page.locator(f"table.nodes tr.selected[data-id='{slow}']").count()
    assert not page.dialogs and not page.outside


def test_at_800_px_tables_scroll_and_the_tree_is_not_clipped(two, browser):
    ui, a, b, task, slow = two
    context = browser.new_context(viewport={"width": 800, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{ui.url}/runs/{b}")
        assert LONG_REASON in page.inner_text("table.tasks")
        cells = page.locator("table.tasks td, table.runs td")
        heights = [cells.nth(i).bounding_box()["height"] for i in range(cells.count())]
        assert max(heights) < 40, heights  # one line each: no wrapping into tall cells
        box = page.locator("table.tasks").evaluate("t => [t.parentElement.scrollWidth, t.parentElement.clientWidth]")
        assert box[0] > box[1] and page.evaluate("document.documentElement.scrollWidth") <= 800  # the box scrolls
        page.goto(f"{ui.url}/runs/{b}/tasks/{task}#node-{slow}")
        page.wait_for_selector(f"#panel .node[data-node='{slow}']")
        label = page.text_content(f"#tree .node[data-id='{slow}'] text")
        assert "1.10x" in label and "chunk=0" in label and "simd=True" in label  # knobs on the tree
        tree = page.evaluate("""() => { const t = document.getElementById('tree'), s = t.querySelector('svg');
            return {sw: t.scrollWidth, cw: t.clientWidth, svg: s.getBoundingClientRect().width,
                    attr: Number(s.getAttribute('width')), ov: getComputedStyle(t).overflowX,
                    right: t.getBoundingClientRect().right}; }""")
        assert tree["svg"] == pytest.approx(tree["attr"])  # drawn whole, not shrunk
        assert tree["ov"] == "auto" and tree["right"] <= 800  # inside the page; scrolls when wider
        assert tree["sw"] >= tree["attr"] - 1
        for svg in page.locator("#panel svg").all():  # the timing chart's labels (125k us) are whole
            frame = svg.bounding_box()
            for t in svg.locator("text").all():
                b_ = t.bounding_box()
                assert frame["x"] - 0.5 <= b_["x"] and b_["x"] + b_["width"] <= frame["x"] + frame["width"] + 0.5, (
                    t.text_content())
    finally:
        context.close()
