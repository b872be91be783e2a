"""Bad numbers and addresses on the command line: one line on stderr, exit 2, before anything starts (no store
created, nothing served)."""

import socket
from pathlib import Path

import pytest

from forge.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "rmsnorm_swiglu.py")


@pytest.mark.parametrize("argv, says", [
    (["optimize", EXAMPLE, "--seconds", "0"], "Invalid --seconds: 0.0"),
    (["optimize", EXAMPLE, "--seconds", "-3"], "Invalid --seconds: -3.0"),
    (["optimize", EXAMPLE, "--seconds", "inf"], "Invalid --seconds: inf"),
    (["optimize", EXAMPLE, "--seconds", "nan"], "Invalid --seconds: nan"),
    (["optimize", EXAMPLE, "--seconds", "1", "--budget", "0"], "Invalid --budget: 0"),
    (["optimize", EXAMPLE, "--seconds", "1", "--budget", "-5"], "Invalid --budget: -5"),
    (["optimize", EXAMPLE, "--seconds", "1", "--policy", "openai:m", "--max-usd", "-1"], "Invalid --max-usd: -1.0"),
    (["profile", EXAMPLE, "--budget", "0"], "Invalid --budget: 0.0"),
    (["profile", EXAMPLE, "--top", "-1"], "Invalid --top: -1"),
    (["eval", "k.cu", "--task", "t", "--timeout", "-1"], "Invalid --timeout: -1.0"),
    (["runs", "--limit", "-2"], "Invalid --limit: -2"),
    (["ui", "--port", "70000"], "Invalid --port: 70000"),
    (["lab", "--port", "0"], "Invalid --port: 0"),
])
def test_a_number_out_of_bounds_is_one_line_and_exit_2(argv, says, capsys, tmp_path):
    db = tmp_path / "f.db"  # forge profile keeps no store: the rest are told where one would be
    assert main(argv if argv[0] == "profile" else [*argv, "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forge: error: {says} (") and "\n" not in err, err
    assert not db.exists()  # refused before anything started


@pytest.mark.parametrize("command", ["ui", "lab"])
def test_a_port_in_use_is_one_line_and_exit_2_with_nothing_printed_as_served(command, capsys, tmp_path):
    pytest.importorskip("uvicorn")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = [command, "--port", str(port)] + (["--db", str(tmp_path / "f.db")] if command == "ui" else [])
        if command == "ui":
            from forge.store import Store

            Store(str(tmp_path / "f.db"))  # an empty store: ui serves only one that exists
        assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.strip() == f"forge: error: cannot serve on 127.0.0.1:{port}: Address already in use (--port picks " \
        "another port)"
    assert "http://" not in out


def test_a_host_that_does_not_resolve_is_one_line_and_exit_2(capsys):
    pytest.importorskip("uvicorn")
    assert main(["lab", "--host", "no-such-host.invalid", "--port", "8766"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("forge: error: cannot serve on no-such-host.invalid:8766: ") and \
        err[-1].endswith("(--host names another address)")


def test_an_output_path_gets_its_folder_and_one_that_cannot_be_written_is_one_line(capsys, tmp_path):
    """--json/--html: a missing folder is made (as forge profile --json does); a path under a file, or a folder,
    is one line and exit 2; forge optimize checks its --json before it starts, not after the run."""
    import json

    from forge.store import Store

    db = tmp_path / "f.db"
    Store(str(db))
    out = tmp_path / "new" / "deeper" / "runs.json"
    assert main(["runs", "--db", str(db), "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == []
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for argv, path in ((["runs"], blocker / "sub" / "x.json"), (["runs"], tmp_path),
                       (["optimize", EXAMPLE, "--seconds", "5"], blocker / "x.json")):
        assert main([*argv, "--db", str(db), "--json", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        says = f"{blocker} is not a folder" if path != tmp_path else "it is a folder"
        assert err == f"forge: error: cannot write {path}: {says}", err
    assert Store(str(db)).list_runs() == []  # the optimize was refused before it made a run


def test_forge_profile_checks_its_json_before_the_capture_and_writes_it_as_one_line_on_failure(capsys, tmp_path):
    """forge profile --json under a file: refused before the model is captured (no table printed); a profile
    that cannot be written where the check could not see it (/proc lets root look writable) is a UserError."""
    from forge.capture.profile import Profile
    from forge.errors import UserError

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["profile", EXAMPLE, "--json", str(blocker / "p.json")]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == f"forge: error: cannot write {blocker / 'p.json'}: {blocker} is not a folder"
    assert out == ""  # nothing was captured
    prof = Profile(model="m", device="cpu", dtype="fp32", total_ms=1.0, tasks=())
    with pytest.raises(UserError, match=r"^cannot write /proc/forge-profile\.json: "):
        prof.save("/proc/forge-profile.json")
    prof.save(tmp_path / "made" / "p.json")
    assert Profile.load(tmp_path / "made" / "p.json").model == "m"


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_2_without_its_password(capsys, tmp_path):
    """forge.errors.StoreUnavailable from the store's opening: a file that is no database, a folder, a path under a
    file, a database server that does not answer, a dialect SQLAlchemy does not have, a URL that does not parse, an
    unescaped @ in a password (whose rest the driver would name as the host)."""
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a database\n" * 10)
    port = _closed_port()
    for db, says in ((str(garbage), "file is not a database"), (str(tmp_path), "unable to open database file"),
                     (str(garbage / "x.db"), f"{garbage} is not a folder"),
                     (f"postgresql://someone:hunter2@127.0.0.1:{port}/x", "Connection refused"),
                     ("nosuchdialect://someone:hunter2@host/x", "Can't load plugin"),
                     ("postgresql://someone:hunter2@localhost:notaport/x", "invalid literal for int()"),
                     (f"postgresql://someone:hunt@er2@127.0.0.1:{port}/x", "an @ in its password must be written %40")):
        # a URL, for a review command too (a path that is no file is "no run store at" there: forge.review.data)
        for argv in ([["runs"]] if "://" in db else []) + [["optimize", EXAMPLE, "--seconds", "1"]]:
            assert main([*argv, "--db", db]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("forge: error: ") and says in err and "\n" not in err, err
            assert "hunter2" not in err and "er2" not in err



def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the with ends: nothing listens there


def test_an_artifact_folder_that_cannot_be_made_and_device_meta_are_refused_before_the_run(capsys, tmp_path,
                                                                                        monkeypatch):
    from forge.store import Store

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    db = tmp_path / "f.db"
    assert main(["optimize", EXAMPLE, "--seconds", "1", "--db", str(db), "--out", str(blocker / "runs")]) == 2
    assert capsys.readouterr().err.strip() == f"forge: error: cannot write {blocker / 'runs'}: {blocker} is " \
        "not a folder"
    monkeypatch.setenv("FORGE_OUT", str(blocker))
    assert main(["optimize", EXAMPLE, "--seconds", "1", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip() == f"forge: error: cannot write {blocker}: {blocker} is not a folder"
    assert Store(str(db)).list_runs() == []
    assert main(["optimize", EXAMPLE, "--seconds", "1", "--db", str(tmp_path / "g.db"), "--device", "meta"]) == 2
    assert capsys.readouterr().err.strip().startswith("forge: error: --device meta captures shapes and times nothing")
    assert not (tmp_path / "g.db").exists()


def test_ctrl_c_stops_forge_ui_as_a_normal_end(tmp_path):
    """uvicorn stops the server on SIGINT and raises it again: forge ui ends with exit 0 and no 'interrupted'."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("uvicorn")
    from forge.store import Store

    Store(str(tmp_path / "f.db"))
    port = _closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "ui", "--db", str(tmp_path / "f.db"), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/" in out and "interrupted" not in err


def test_lab_takes_its_port_before_it_builds(capsys, tmp_path):
    """forge lab --build --serve on a port in use is refused at once: nothing is built into the cache."""
    pytest.importorskip("uvicorn")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["lab", "--build", "--serve", "--port", str(port), "--cache", str(tmp_path / "cache")]) == 2
    assert "Address already in use" in capsys.readouterr().err
    assert not any((tmp_path / "cache").rglob("*.json"))


def test_a_model_file_that_is_not_there_makes_no_store(capsys, tmp_path):
    db = tmp_path / "runs" / "forge.db"
    assert main(["optimize", str(tmp_path / "typo.py"), "--seconds", "1", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"forge: error: model file not found: {tmp_path / 'typo.py'}")
    assert not (tmp_path / "runs").exists()


def test_resuming_from_a_store_that_is_not_there_is_one_line_and_makes_none(capsys, tmp_path):
    db = tmp_path / "typo.db"
    assert main(["optimize", EXAMPLE, "--resume", "r1", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip() == f"forge: error: no run store at {db} (--db PATH|URL or " \
        "FORGE_DB=PATH|URL points at another store)"
    assert not db.exists()


@pytest.mark.parametrize("policy, says", [
    ("nope", "Invalid policy 'nope': use recipes, openai:MODEL"),
    ("recipes+anthropic:claude-x", "ANTHROPIC_API_KEY is not set: export it to use --policy anthropic:claude-x"),
])
def test_a_policy_that_cannot_run_is_refused_before_the_store_is_made(policy, says, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    db = tmp_path / "runs" / "forge.db"
    assert main(["optimize", EXAMPLE, "--policy", policy, "--seconds", "5", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forge: error: {says}") and "\n" not in err, err
    assert not (tmp_path / "runs").exists()
