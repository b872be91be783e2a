"""Where things go: the store (--db > $FORGE_DB > runs/forge.db), the artifact (--out > $FORGE_OUT > next to the
SQLite store), found again by the review commands from another folder; real SQLite, real CLI processes."""

import json
import os
import subprocess
import sys

import pytest
from conftest import EXAMPLES, ROOT

from forge.cli import main
from forge.job import _artifact_folder, artifacts_root
from forge.store import Store

MODEL = EXAMPLES / "rmsnorm_swiglu.py"
QUICK = ["--seconds", "20", "--budget", "4", "--no-inductor"]


def forge(*args: str, cwd, **env: str) -> subprocess.CompletedProcess:
    """`forge ARGS` as a separate process in `cwd`, with `env` added to the environment."""
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=300)


@pytest.mark.slow
def test_forge_db_holds_the_run_and_its_artifact_and_review_finds_it_from_elsewhere(tmp_path):
    here, there, db = tmp_path / "here", tmp_path / "there", tmp_path / "store" / "f.db"
    here.mkdir()
    there.mkdir()
    done = forge("optimize", str(MODEL), *QUICK, "--json", "r.json", cwd=here, FORGE_DB=str(db))
    assert done.returncode == 0, done.stderr
    report = json.loads((here / "r.json").read_text())
    run_id, folder = report["run_id"], db.parent / report["run_id"]
    assert report["artifact"] == str(folder) and (folder / "manifest.json").is_file()  # beside the store
    assert not (here / "runs").exists()  # nothing under the current folder
    assert f"kernels in {folder}" in done.stdout and f"stored in {db}" in done.stdout
    assert Store(db).get_run(run_id).config["artifact"] == str(folder)

    shown = forge("report", run_id, cwd=there, FORGE_DB=str(db))
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id}" in shown.stdout and f"artifact: {folder}" in shown.stdout
    listed = forge("runs", "--json", "-", cwd=there, FORGE_DB=str(db))
    assert [r["id"] for r in json.loads(listed.stdout)] == [run_id]
    flag = forge("tree", "last", "--json", "-", "--db", str(db), cwd=there, FORGE_DB=str(tmp_path / "other.db"))
    assert json.loads(flag.stdout)["run_id"] == run_id  # --db wins over $FORGE_DB
    assert not (tmp_path / "other.db").exists()


@pytest.mark.slow
def test_out_puts_the_artifact_there(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    db, out = tmp_path / "db" / "f.db", tmp_path / "kernels"
    assert main(["optimize", str(MODEL), *QUICK, "--db", str(db), "--out", "kernels", "--json", "r.json"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    folder = out / report["run_id"]
    assert report["artifact"] == str(folder) and (folder / "manifest.json").is_file()
    assert not (db.parent / report["run_id"]).exists() and not (tmp_path / "runs").exists()
    assert Store(db).get_run(report["run_id"]).config["artifact"] == str(folder)
    assert f"--db {db}" in capsys.readouterr().out  # the review command printed finds the store from anywhere


def test_the_artifact_root_follows_out_then_forge_out_then_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = Store(tmp_path / "s" / "f.db")
    assert artifacts_root(store) == tmp_path / "s"
    assert artifacts_root(Store()) == tmp_path / "runs"  # the default store, runs/forge.db: runs/
    assert artifacts_root(Store(":memory:")) == tmp_path / "runs"  # no folder of its own
    monkeypatch.setenv("FORGE_OUT", str(tmp_path / "env"))
    assert artifacts_root(store) == tmp_path / "env"
    assert artifacts_root(store, "flag") == tmp_path / "flag"


def test_a_resumed_run_keeps_its_artifact_folder_unless_out_is_given(tmp_path):
    store = Store(tmp_path / "f.db")
    run = store.create_run("m.py", config={"budget": {}, "artifact": str(tmp_path / "first" / "r1")})
    assert _artifact_folder(store, run, None) == tmp_path / "first" / "r1"
    assert _artifact_folder(store, run, tmp_path / "new") == tmp_path / "new" / run.id
    assert store.get_run(run.id).config == {"budget": {}, "artifact": str(tmp_path / "new" / run.id)}


def test_an_unknown_run_or_store_names_the_store_searched(tmp_path, monkeypatch, capsys):
    db = tmp_path / "s" / "f.db"
    Store(db).create_run("m.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("FORGE_DB", str(db))
    for argv in (["tree", "r1999"], ["report", "r1999"], ["show", "r1999", "1"], ["optimize", "--resume", "r1999"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "r1999" in err and str(db) in err and "FORGE_DB" in err and "--db" in err and "\n" not in err, argv
    monkeypatch.setenv("FORGE_DB", "absent.db")
    assert main(["runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"no run store at {elsewhere / 'absent.db'} (named by $FORGE_DB;" in err and "\n" not in err
    assert not (elsewhere / "absent.db").exists()


def test_help_shows_where_things_go(capsys):
    for command in ("optimize", "report", "ui"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "$FORGE_DB" in text and "runs/forge.db" in text, command
    assert "$FORGE_OUT" in text  # the epilog of every command says where the artifact goes
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--out DIR" in text and "DIR/<run id>/" in text and "/x/ for --db /x/forge.db" in text
