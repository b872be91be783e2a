"""The best-so-far curves agree with the decided speedup; the run's speedup against wall time (progress.py)."""

import pytest

from forge.review import svg
from forge.review.data import run_view, task_view
from forge.review.html import run_charts
from forge.review.progress import MODEL
from forge.review.report import report_json
from forge.store import Store


def noisy_task(db, decided: bool = True):
    """A task whose first candidate looked 3x in the search (a noisy timing) and 1.1x timed again, while the
    second (1.5x, then 1.4x timed again) won: the search's decision, stored as after forge.search.confirm."""
    store = Store(db)
    run = store.create_run("examples/noisy.py", device="cpu", dtype="fp32", policy="recipes")
    task = store.add_task(run.id, "silu-noisy", family="activation", ms=2.0, share=0.5, state="done")
    root = store.add_candidate(task.id, None, backend="eager", source="def region(x): ...", origin="baseline",
                               status="ok")
    ids = []
    for first in (3.0, 1.5, 0.8):
        c = store.add_candidate(task.id, root.id, backend="cpu", source="int forge_launch() { return 0; }",
                                origin="recipes", status="ok", visits=1, reward=first - 1)
        store.add_evaluation(c.id, status="ok", time_us_median=100.0 / first, baseline_us_median=100.0)
        ids.append(c.id)
    for node, again in ((ids[0], 1.1), (ids[1], 1.4)):  # the re-timings come last, as the search makes them
        store.add_evaluation(node, status="ok", message="timed again", time_us_median=100.0 / again,
                             baseline_us_median=100.0)
    if decided:
        store.update_task(task.id, meta={"best_node": ids[1], "verdict": "improved"})
    store.update_run(run.id, state="done", eager_ms=4.0, forge_ms=3.5)
    return store, store.get_run(run.id), store.get_task(task.id), ids


def test_the_curve_ends_on_the_decision_and_counts_each_candidate_once(tmp_path):
    store, run, task, ids = noisy_task(tmp_path / "noisy.db")
    t = task_view(store, task)
    assert t.best_id == ids[1] and t.speedup == pytest.approx(1.4)
    assert len(t.curve) == t.tried == 3  # the two re-timings are not new candidates
    assert t.curve[:2] == pytest.approx((3.0, 3.0))  # the search's best while it searched (the noisy one)
    assert t.curve[-1] == pytest.approx(t.speedup) and t.progress.decided  # not 3.0: the decision
    assert max(v for v in t.curve if v is not None) > t.curve[-1]  # the curve may fall to the decision
    data = report_json(run_view(store, run))["tasks"][0]
    assert data["best_so_far"][-1] == pytest.approx(data["speedup"]) and data["decided"]
    chart = run_charts(run_view(store, run))["curves"]
    assert chart.count('class="decided"') == 1 and "1.40x after 3, decided" in chart


def test_an_undecided_task_ends_on_its_speedup(tmp_path):
    store, run, task, ids = noisy_task(tmp_path / "noisy.db", decided=False)  # no decision yet
    t = task_view(store, task)
    assert not t.progress.decided and t.curve[-1] == pytest.approx(t.speedup) == pytest.approx(1.4)  # re-timed
    assert len(t.curve) == 3
    assert 'class="decided"' not in run_charts(run_view(store, run))["curves"]


def test_wall_time_series_of_the_noisy_task(tmp_path):
    store, run, task, _ = noisy_task(tmp_path / "noisy.db")
    series = dict(run_view(store, run).wall_series())
    assert list(series) == ["silu-noisy", MODEL]
    pts = series["silu-noisy"]
    assert len(pts) == 4 and [y for _, y in pts] == pytest.approx([3.0, 3.0, 3.0, 1.4])  # 3 candidates, decided
    assert pts[-1][0] >= pts[-2][0] >= 0
    model = [y for _, y in series[MODEL]]
    assert model[-1] == pytest.approx(1 / (1 - 0.5 * (1 - 1 / 1.4)))  # the shipped winner's share of time saved


def test_wall_time_series_on_a_real_search(rs):
    store = Store(rs.db)
    view = run_view(store, store.get_run(rs.run_id))
    series = dict(view.wall_series())
    searched = [t for t in view.tasks if t.tried]
    assert set(series) == {t.task.key for t in searched} | {MODEL}
    retimed = sum(e.message == "timed again" for t in searched for n in t.nodes for e in store.evaluations(n.cand.id))
    assert retimed >= 1  # the search timed its fastest candidates again
    last = max(e.created_at for t in searched for n in t.nodes for e in store.evaluations(n.cand.id))
    end = last - view.run.created_at  # (the hostile node was added after the run finished)
    for t in searched:
        pts = series[t.task.key]
        xs = [x for x, _ in pts]
        assert xs == sorted(xs) and 0 <= xs[0] and xs[-1] <= end.total_seconds()
        assert len(pts) == t.tried + 1 and pts[-1][1] == t.speedup  # each candidate, then the decision
    saved = sum((t.task.share or 0) * (1 - 1 / t.speedup) for t in searched if t.improved and t.speedup)
    assert series[MODEL][-1][1] == pytest.approx(1 / (1 - saved))
    assert len(series[MODEL]) == sum(len(series[t.task.key]) for t in searched)
    chart = run_charts(view)["wall"]
    assert "wall time since the run started (s)" in chart and "speedup (x)" in chart and MODEL in chart
    assert report_json(view)["against_wall_time"][-1]["series"] == MODEL


def test_step_xy_labels_fit():
    chart = svg.step_xy([("a", [(0.0, 1.0), (61.3, 1.5), (125000.0, 2.0)])], "t", "wall time (s)", "speedup (x)")
    assert ">125k<" in chart and ">wall time (s)<" in chart and ">speedup (x)<" in chart
    assert "2.00x at 125k s" in chart
