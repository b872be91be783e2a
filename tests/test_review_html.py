"""The review's HTML without a search: templates escape hostile text, sources are highlighted from the kernel
on (the prelude folded), axis labels are whole, runs compare side by side, a running run counts "N of M"."""

import re

import pytest
from review_store import HOSTILE_SOURCE, two_runs

from forge.cli import main
from forge.policy.recipes.cuda_common import PRELUDE as CUDA_PRELUDE
from forge.policy.recipes.pointwise import PRELUDE
from forge.review import html, svg
from forge.review.compare import compare_page, pair_tasks
from forge.review.data import node_detail, run_view
from forge.review.source import highlight, split_prelude
from forge.store import Store

KERNEL = "// forge recipe: pointwise, 1 x 64, knobs Knobs()\nextern \"C\" int forge_launch() { return 0; }\n"


@pytest.fixture
def runs(tmp_path):
    db = tmp_path / "two.db"
    return Store(db), *two_runs(db)


def test_the_prelude_is_split_off_at_the_kernel():
    for prelude in (PRELUDE, CUDA_PRELUDE):
        parts = split_prelude(prelude + "\n" + KERNEL)
        assert parts.kernel == KERNEL and parts.prelude == prelude + "\n" and parts.prelude_lines > 20
    llm = "#include <math.h>\n#include <stdint.h>\n#include \"forge_abi.h\"\nstatic float f(float x) { return x; }\n"
    llm += "static float g(float x) { return x; }\n// the kernel\n__global__ void k() {}\n"
    assert split_prelude(llm).kernel == "// the kernel\n__global__ void k() {}\n"
    assert split_prelude(HOSTILE_SOURCE).prelude == ""  # short: nothing to fold


def test_highlighting_escapes_and_marks_tokens():
    out = highlight(HOSTILE_SOURCE, "cpu")
    assert "<script" not in out and "&lt;/pre&gt;&lt;script&gt;" in out and 'class="hl-' in out
    assert highlight("<b>", "no-such-lexer") == "&lt;b&gt;"


def test_node_panel_folds_the_prelude_and_escapes(tmp_path):
    store = Store(tmp_path / "n.db")
    run = store.create_run("m.py", device="cpu")
    task = store.add_task(run.id, "k", family="activation")
    root = store.add_candidate(task.id, None, backend="eager", origin="baseline", status="ok")
    node = store.add_candidate(task.id, root.id, backend="cpu", source=PRELUDE + "\n" + KERNEL + HOSTILE_SOURCE,
                               knobs={"note": "<i>knob</i>"}, status="build_error")
    store.add_evaluation(node.id, status="build_error", message="<img src=x onerror=alert(1)>",
                         build_log="<script>alert('log')</script>")
    panel = html.node_panel(node_detail(store, node.id))
    assert "<script" not in panel and "<img" not in panel and "<i>" not in panel
    assert "&lt;img src=x onerror=alert(1)&gt;" in panel and "&lt;i&gt;knob&lt;/i&gt;" in panel
    folded = re.search(r"<details class=\"prelude\">(.*?)</details>", panel, re.S)
    assert folded and "forge_expf" in folded.group(1) and "forge_launch" not in folded.group(1)
    kernel = panel[folded.end():]
    assert re.search(r'<pre class="code kernel"><span class="hl-c1">// forge recipe', kernel)


def test_axis_labels_are_short_and_whole():
    assert [svg.si(v) for v in (0.5, 12, 2500, 12500, 125000, 1.5e6)] == ["0.5", "12", "2500", "12.5k", "125k", "1.5M"]
    chart = svg.ranges([("candidate", {"median": 125000.0, "p10": 120000.0, "p90": 131000.0})], "us", "t")
    labels = re.findall(r'<text x="([\d.]+)"[^>]*text-anchor="middle">([^<]+)</text>', chart)
    ticks = [t for _, t in labels if not t.startswith("median")]
    assert ticks == ["0", "50k", "100k", "150k"]
    width = 640
    assert all(float(x) + 3.5 * len(t) <= width for x, t in labels if t in ticks)  # half a label (7 px a char) fits
    assert "median 125k us</text>" in chart


def test_compare_pairs_tasks_and_escapes(runs):
    store, a, b, _, _ = runs
    va, vb = (run_view(store, store.get_run(r)) for r in (a, b))
    pairs = pair_tasks(va, vb)
    assert [p.key for p in pairs] == ["silu-compare", "mean-only-b"] and pairs[1].a is None
    assert pairs[0].ratio == pytest.approx(3.0 / 1.5)
    page = compare_page(va, vb, inline_css=False)
    assert "not in this run" in page and "3.00x" in page and "1.50x" in page and "2.00" in page
    assert f'<a href="/runs/{a}">' in page and "0 of 40" not in page and "2 of 40" in page
    store.update_task(va.tasks[0].task.id, stop_reason="<script>alert(1)</script>")
    store.create_run("<script>x</script>", device="cpu")
    assert "<script" not in compare_page(run_view(store, store.get_run(a)), vb, inline_css=True)


def test_report_compare_writes_one_self_contained_file(runs, tmp_path, capsys):
    store, a, b, _, _ = runs
    out = tmp_path / "cmp.html"
    assert main(["report", b, "--compare", a, "--db", str(store.file), "--html", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    assert "<script" not in page and "<link" not in page and "default-src 'none'" in page and "<style>" in page
    assert a in page and b in page and "mean-only-b" in page


def test_runs_list_links_compare_and_counts_candidates(runs):
    store, a, b, _, _ = runs
    from forge.review.data import list_summaries

    running = store.create_run("examples/compare.py", device="cpu", config={"budget": {"candidates": 40}})
    table = html.runs_table(list_summaries(store))
    assert f"/compare?a={b}&amp;b={running.id}" in table and f"/compare?a={a}&amp;b={b}" in table
    assert '<span class="progress">0 of 40</span>' in table
    sections = html.run_sections(run_view(store, store.get_run(b)), link=True)
    assert "6 of 40 candidates" in sections
