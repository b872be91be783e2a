"""One speedup per task: a real forge optimize on the CPU, and its task speedups in the CLI table, the JSON
report, forge report and forge tree are the same number, its best node's, with the same interval."""

import json

import pytest
from conftest import EXAMPLES

from forge.cli import main
from forge.confidence import fmt
from forge.store import Store


def test_a_tasks_speedup_is_its_best_nodes_in_the_cli_the_json_the_report_and_the_tree(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    db, out = str(tmp_path / "f.db"), tmp_path / "optimize.json"
    assert main(["optimize", str(EXAMPLES / "rmsnorm_swiglu.py"), "--budget", "6", "--seconds", "40", "--db", db,
                 "--json", str(out), "--no-inductor"]) == 0
    cli = capsys.readouterr().out
    report = json.loads(out.read_text())
    searched = {t["key"]: t for t in report["tasks"] if t["speedup"] is not None}
    assert searched, report["tasks"]
    run_id = report["run_id"]
    assert main(["report", run_id, "--db", db, "--json", str(tmp_path / "report.json")]) == 0
    assert main(["tree", run_id, "--db", db, "--json", str(tmp_path / "tree.json")]) == 0
    tree_text = capsys.readouterr().out
    reviewed = {t["key"]: t for t in json.loads((tmp_path / "report.json").read_text())["tasks"]}
    trees = {t["task"]["key"]: t for t in json.loads((tmp_path / "tree.json").read_text())["tasks"]}
    store = Store(db)
    for key, t in searched.items():
        lo, hi = t["speedup_ci"]
        assert lo <= t["speedup"] <= hi and t["status"] in ("improved", "no gain", "no gain (within noise)")
        assert t["speedup"] == pytest.approx(t["eager_us"] / t["best_us"])  # the columns say the same
        r = reviewed[key]
        assert r["speedup"] == pytest.approx(t["speedup"]) and r["speedup_ci"] == pytest.approx(t["speedup_ci"])
        assert r["verdict"] == t["status"] and r["noisy"] == t["noisy"]
        assert (r["eager_us"], r["best_us"]) == pytest.approx((t["eager_us"], t["best_us"]))
        best = next(n for n in trees[key]["nodes"] if n["id"] == r["best_node"])
        assert best["best"] and best["speedup"] == pytest.approx(t["speedup"])
        assert trees[key]["task"]["speedup"] == pytest.approx(t["speedup"])
        shown = fmt(t["speedup"], tuple(t["speedup_ci"]), t["noisy"])
        assert f"best {shown}" in tree_text
        assert shown.split(" [")[0] in cli.split(key, 1)[1].splitlines()[0]  # the task's row of the final table
        # the task's fastest candidate was timed again with enough samples for an interval (forge.search.confirm)
        task = next(k for k in store.get_tasks(run_id) if k.key == key)
        again = [e for c in store.candidates(task.id) for e in store.evaluations(c.id) if e.message == "timed again"]
        assert again and all(e.time_us_spread["n"] >= 30 and e.time_us_spread["ci_lo"] for e in again)
