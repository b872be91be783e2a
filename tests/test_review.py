"""Review over a real search: run views, forge runs/tree/show/report (terminal, JSON, HTML), the ui's API."""

import json
import re
import socket
import urllib.error
import urllib.request

import pytest
from review_store import HOSTILE_LOG, HOSTILE_MESSAGE, HOSTILE_SOURCE

from forge.cli import main
from forge.review.data import run_view
from forge.review.report import report_html
from forge.store import Store


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # rich wraps at 80 columns when not on a terminal


def get(url: str, method: str = "GET") -> tuple[int, dict, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_run_view_agrees_with_the_search(rs):
    store = Store(rs.db)
    view = run_view(store, store.get_run(rs.run_id))
    reported = {t["key"]: t for t in rs.report["tasks"]}
    stored = {t.task.key for t in view.tasks}
    assert {k for k, t in reported.items() if t["candidates"]} <= stored <= set(reported)
    assert any(t.tried for t in view.tasks)
    for t in view.tasks:
        r = reported[t.task.key]
        hostile = int(t.task.id == rs.task_id)
        assert t.tried == r["candidates"] + hostile and t.failed >= hostile
        assert (t.speedup is None) == (r["speedup"] is None)
        assert t.speedup is None or t.speedup == pytest.approx(r["speedup"])
        assert len(t.curve) == t.tried  # one point a candidate: re-timings are not candidates
        if t.tried:
            assert t.progress.decided and t.curve[-1] == t.speedup  # the curve ends on the decided speedup
            root = t.nodes[0]
            assert root.baseline and root.cand.parent_id is None and root.visits == t.tried
            depth = {n.cand.id: n.depth for n in t.nodes}
            assert all(depth[n.cand.parent_id] + 1 == n.depth for n in t.nodes[1:])  # parents come first
            if hostile:  # it hangs below a searched candidate: a grandchild of the root or deeper (how deep the
                assert depth[rs.hostile_id] >= 2  # search went before it depends on the timings)
            assert sum(n.best for n in t.nodes) == (1 if t.best_us else 0)
    assert view.summary.speedup == pytest.approx(rs.report["speedup"])
    assert view.summary.cost.usd == pytest.approx(0.0125) and view.summary.cost.tokens_in == 120
    assert view.summary.cost.device_seconds == pytest.approx(rs.report["cost"]["device_seconds"])
    fams = view.families()
    task = view.tasks[0].task
    assert sum(b for _, b, _ in fams) == pytest.approx(task.ms / task.share)  # all of the profiled model time
    assert all(a <= b + 1e-9 for _, b, a in fams)
    shipped = {t.task.family for t in view.tasks if t.improved} if rs.report["applied"] else set()
    assert {f for f, b, a in fams if a < b} == shipped


def test_runs_tree_and_show_in_the_terminal(rs, capsys, wide):
    assert main(["runs", "--db", str(rs.db)]) == 0
    out = capsys.readouterr().out
    assert rs.run_id in out and "rmsnorm_swiglu.py" in out and "done" in out

    assert main(["tree", rs.run_id, "--db", str(rs.db)]) == 0
    out = capsys.readouterr().out
    assert "eager baseline" in out and "★ best" in out and f"#{rs.hostile_id} build_error" in out
    assert HOSTILE_MESSAGE in out  # the failed node's reason, printed as text (rich markup not interpreted)
    searched = [t["key"] for t in rs.report["tasks"] if t["candidates"]]
    assert all(k in out for k in searched)

    assert main(["tree", "last", "--task", searched[-1][:6], "--db", str(rs.db)]) == 0
    out = capsys.readouterr().out
    assert searched[-1] in out and all(k not in out for k in searched[:-1])

    assert main(["show", rs.run_id, f"#{rs.hostile_id}", "--db", str(rs.db)]) == 0
    out = capsys.readouterr().out
    for text in ('<script>alert("source")</script>', "diff against parent", f"+++ #{rs.hostile_id}", HOSTILE_LOG,
                 "prompt", "alert('answer')", "LLM call test:hostile", "120 in, 80 out, $0.0125, 1.5 s",
                 "code taken from the answer"):
        assert text in out, text


def test_bad_references_are_one_line_errors(rs, capsys, tmp_path):
    assert main(["show", rs.run_id, "999999", "--db", str(rs.db)]) == 2
    assert "unknown candidate id 999999" in capsys.readouterr().err
    assert main(["show", rs.run_id, "abc", "--db", str(rs.db)]) == 2
    assert main(["tree", "r1999", "--db", str(rs.db)]) == 2
    assert "no run matching 'r1999'" in capsys.readouterr().err
    assert main(["runs", "--db", str(tmp_path / "absent.db")]) == 2
    assert "no run store at" in capsys.readouterr().err and not (tmp_path / "absent.db").exists()


def test_report_writes_json_and_a_self_contained_html(rs, tmp_path, capsys, wide):
    html_path, json_path = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["report", rs.run_id, "--db", str(rs.db), "--html", str(html_path), "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert "end to end" in out and "profiled model time by op family" in out and "cost: $0.0125" in out

    data = json.loads(json_path.read_text())
    assert data["run_id"] == rs.run_id and data["speedup"] == pytest.approx(rs.report["speedup"])
    assert {"key", "family", "share", "eager_us", "best_us", "speedup", "candidates", "best_so_far"} <= data["tasks"][
        0].keys()
    assert data["families"] and data["cost"]["tokens_out"] == 80
    gain = data["speedup"] - 1
    assert data["cost"]["speedup_gain_per_usd"] == pytest.approx(gain / 0.0125)
    assert data["cost"]["speedup_gain_per_device_hour"] == pytest.approx(gain / (data["cost"]["device_seconds"] / 3600))

    page = html_path.read_text()
    assert page.count("<svg") == 4  # end to end, op families, best so far against candidates and wall time
    assert all(t["key"] in page for t in data["tasks"])
    assert "<script" not in page and "<link" not in page and " src=" not in page
    # every LLM call: tokens, cost, latency, and (folded) its prompt, answer and the code its node took, escaped
    calls = page.split("<h2>LLM calls</h2>", 1)[1]
    assert "$0.0125" in calls and "1.5 s" in calls and f"#{rs.hostile_id}" in calls
    assert "alert(&#39;prompt&#39;)" in calls and "alert(&#39;answer&#39;)" in calls and "Code taken" in calls
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}  # a namespace only


def test_report_html_escapes_untrusted_text(tmp_path):
    store = Store(tmp_path / "h.db")
    run = store.create_run("<script>alert('model')</script>.py", device="cpu", policy="<b>p</b>")
    task = store.add_task(run.id, "<img src=x onerror=alert(1)>", family="<script>f</script>", ms=1.0, share=0.5,
                          stop_reason="<script>alert('stop')</script>")
    root = store.add_candidate(task.id, None, backend="eager", origin="baseline", status="ok")
    node = store.add_candidate(task.id, root.id, backend="cpu", source=HOSTILE_SOURCE, status="ok")
    store.add_evaluation(node.id, status="ok", time_us_median=1.0, baseline_us_median=2.0)
    store.update_run(run.id, state="done", eager_ms=2.0, forge_ms=1.0)
    page = report_html(run_view(store, store.get_run(run.id)))
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&#39;model&#39;)&lt;/script&gt;.py" in page  # markupsafe's entities
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_api_serves_runs_trees_and_nodes(rs, ui):
    status, headers, body = get(ui.url + "/api/runs")
    runs = {r["id"]: r for r in json.loads(body)["runs"]}
    assert status == 200 and runs[rs.run_id]["speedup"] == pytest.approx(rs.report["speedup"])

    status, _, body = get(f"{ui.url}/api/runs/{rs.run_id}")
    run = json.loads(body)
    assert status == 200 and run["version"] and run["state"] == "done"
    assert {t["key"] for t in run["tasks"]} >= {t["key"] for t in rs.report["tasks"] if t["candidates"]}

    status, _, body = get(f"{ui.url}/api/runs/{rs.run_id}/tasks/{rs.task_id}")
    tree = json.loads(body)
    assert status == 200 and tree["nodes"][0]["baseline"] and tree["nodes"][0]["parent_id"] is None
    ids = [n["id"] for n in tree["nodes"]]
    assert all(ids.index(n["parent_id"]) < ids.index(n["id"]) for n in tree["nodes"][1:])
    bad = next(n for n in tree["nodes"] if n["id"] == rs.hostile_id)
    assert bad["failed"] and bad["reason"].startswith("build_error: <img")

    status, _, body = get(f"{ui.url}/api/nodes/{rs.hostile_id}")
    node = json.loads(body)
    assert status == 200 and node["source"] == HOSTILE_SOURCE and node["evaluations"][0]["build_log"] == HOSTILE_LOG
    assert "+// </pre><script>" in node["diff"] and "alert('prompt')" in node["llm_calls"][0]["prompt"]


def test_api_is_read_only_and_unknown_ids_are_404(rs, ui):
    assert get(ui.url + "/api/runs", method="POST")[0] == 405
    assert get(f"{ui.url}/api/nodes/{rs.hostile_id}", method="DELETE")[0] == 405
    status, _, body = get(ui.url + "/api/nodes/999999")
    assert status == 404 and json.loads(body) == {"error": "unknown candidate id 999999"}
    assert get(ui.url + "/runs/r1999")[0] == 404
    status, headers, _ = get(ui.url + "/")
    assert status == 200 and "script-src 'self'" in headers["content-security-policy"]


def test_pages_escape_untrusted_text(rs, ui):
    status, _, panel = get(f"{ui.url}/fragments/nodes/{rs.hostile_id}")
    assert status == 200 and "<script" not in panel and "<img" not in panel and "</pre><script" not in panel
    assert "&lt;/pre&gt;&lt;script&gt;alert(" in panel  # the source, highlighted by Pygments (which escapes)
    assert "&lt;script&gt;alert(&#39;answer&#39;)&lt;/script&gt;" in panel
    status, _, page = get(f"{ui.url}/runs/{rs.run_id}/tasks/{rs.task_id}")
    assert status == 200 and re.findall(r"<script[^>]*>", page) == ['<script src="/static/forge.js" defer>']
    status, headers, _ = get(ui.url + "/static/forge.js")
    assert status == 200 and "javascript" in headers["content-type"]


def test_ui_binds_to_loopback_only_by_default(ui):
    port = int(ui.url.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # picks the outward interface; sends nothing
            outward = s.getsockname()[0]
        except OSError:
            outward = "127.0.0.1"
    if outward.startswith("127."):
        pytest.skip("this machine has no non-loopback address")
    with pytest.raises(OSError):
        socket.create_connection((outward, port), timeout=2).close()
