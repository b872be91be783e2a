"""forge eval end to end: a profile JSON, a kernel file, a real worker and a real SQLite store."""

import json

from conftest import MODELS

from forge.cli import main
from forge.store import Store

KERNELS = MODELS.parent / "kernels"


def relu_profile(tmp_path):
    path = tmp_path / "relu.json"
    assert main(["profile", str(MODELS / "relu_model.py"), "--budget", "0.1", "--json", str(path)]) == 0
    key = json.loads(path.read_text())["tasks"][0]["key"]
    return path, key


def test_eval_passes_and_stores_median_and_spread(tmp_path, capsys):
    prof, key = relu_profile(tmp_path)
    db = tmp_path / "forge.db"
    code = main(["eval", str(KERNELS / "relu_good.cpp"), "--profile", str(prof), "--task", key[:8],
                 "--db", str(db), "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0 and "ok" in out and "speedup" in out
    store = Store(str(db))
    (run,) = store.list_runs()
    (task,) = store.get_tasks(run.id)
    assert task.key == key
    (cand,) = store.candidates(task.id)
    (ev,) = store.evaluations(cand.id)
    assert ev.status == "ok" and ev.time_us_median > 0 and ev.baseline_us_median > 0
    assert ev.time_us_spread["p10"] <= ev.time_us_median <= ev.time_us_spread["p90"]
    assert ev.time_us_spread["n"] >= 10


def test_eval_rejects_a_wrong_kernel_with_exit_1(tmp_path, capsys):
    prof, key = relu_profile(tmp_path)
    code = main(["eval", str(KERNELS / "relu_leaky.cpp"), "--profile", str(prof), "--task", key, "--no-store"])
    assert code == 1 and "wrong_result" in capsys.readouterr().out


def test_eval_from_a_model_file_and_bad_task(tmp_path, capsys):
    code = main(["eval", str(KERNELS / "relu_good.cpp"), "--model", str(MODELS / "relu_model.py"),
                 "--task", "nosuchtask", "--no-store"])
    assert code == 2 and "no task matching --task 'nosuchtask'" in capsys.readouterr().err
    code = main(["eval", str(tmp_path / "missing.cpp"), "--model", str(MODELS / "relu_model.py"), "--task", "relu"])
    assert code == 2 and "kernel file not found" in capsys.readouterr().err
