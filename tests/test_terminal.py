"""Output that fits: every number whole in a narrow terminal and through a pipe; --json, --version, -v anywhere."""

import io
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from fcntl import ioctl
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT
from rich.console import Console

from forge import terminal
from forge.cli import main
from forge.terminal import Col

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _render(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(renderable)
    return out.getvalue()


def _cli(*args: str, columns: int | None = None, cwd: Path | None = None, timeout: float = 600) -> tuple[int, str]:
    """forge with `args` in a real process: stdout a pipe, or (columns) a pseudo-terminal that wide."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    cmd = [sys.executable, "-m", "forge.cli", *args]
    if columns is None:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
        return proc.returncode, proc.stdout
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(cmd, stdout=follower, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env,
                            cwd=cwd)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(f"forge {' '.join(args)}: no output for {timeout} s")
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r", "")


def test_a_table_keeps_its_numbers_whole_and_becomes_blocks_when_it_cannot():
    cols = [Col("task"), Col("share", True), Col("eager us", True), Col("speedup", True), Col("stopped")]
    rows = [["softmax-3b8333e1e1da-a-long-key", "12.3%", "123456.789", "10.00x",
             "roofline floor reached after 12 candidates [no markup]"], ["rms-1", "0.1%", "7.5", "1.01x", "budget"]]
    for width in (80, 60, 30):
        out = _render(terminal.table(cols, rows, width, title="tasks"), width)
        assert "…" not in out and all(len(line) <= width for line in out.splitlines())
        for cell in ("12.3%", "123456.789", "10.00x", "0.1%", "7.5", "1.01x"):
            assert cell in out, (width, cell)
        assert "[no" in out  # a cell is text, not rich markup
    assert "  share: 12.3%" in _render(terminal.table(cols, rows, 30), 30)  # too narrow for columns: blocks


def test_piped_output_keeps_every_field(rs, tmp_path):
    code, out = _cli("report", rs.run_id, "--db", str(rs.db), "--json", str(tmp_path / "r.json"))
    assert code == 0 and "…" not in out
    data = json.loads((tmp_path / "r.json").read_text())
    for t in data["tasks"]:
        assert t["key"] in out and f"{100 * t['share']:.1f}%" in out
        assert t["stop_reason"] in out  # whole, however long
    code, out = _cli("runs", "--db", str(rs.db))
    assert code == 0 and rs.run_id in out and "rmsnorm_swiglu.py" in out and "…" not in out
    code, out = _cli("show", rs.run_id, str(rs.hostile_id), "--db", str(rs.db))
    assert code == 0 and "diff against parent" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) < 400  # panels as wide as their text, not the stream
    code, out = _cli("profile", str(EXAMPLES / "rmsnorm_swiglu.py"), "--budget", "1", "--json",
                     str(tmp_path / "p.json"))
    prof = json.loads((tmp_path / "p.json").read_text())
    assert code == 0 and "…" not in out
    for t in prof["tasks"]:
        assert t["key"] in out and f"{t['ms']:.3f}" in out and f"{100 * t['share']:.1f}%" in out


def test_an_80_column_terminal_shows_every_number_of_optimize_and_its_review(tmp_path):
    db = tmp_path / "forge.db"
    code, out = _cli("optimize", str(EXAMPLES / "rmsnorm_swiglu.py"), "--budget", "4", "--seconds", "40", "--db",
                     str(db), "--json", str(tmp_path / "o.json"), columns=80, cwd=tmp_path)
    assert code == 0, out
    rep = json.loads((tmp_path / "o.json").read_text())
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    for t in rep["tasks"]:
        if t["status"] != "skipped":
            assert f"{100 * t['share']:.1f}%" in out and (t["speedup"] is None or f"{t['speedup']:.2f}x" in out)
    assert f"{rep['speedup']:.2f}x" in out
    for args in (("runs",), ("report", rep["run_id"])):
        code, out = _cli(*args, "--db", str(db), columns=80)
        assert code == 0 and "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert f"{rep['speedup']:.2f}x" in out


def test_runs_tree_and_show_write_json(rs, capsys):
    assert main(["runs", "--db", str(rs.db), "--json", "-"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in runs] == [rs.run_id] and runs[0]["speedup"] == pytest.approx(rs.report["speedup"])
    assert main(["tree", rs.run_id, "--db", str(rs.db), "--json", "-"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["run_id"] == rs.run_id and any(n["id"] == rs.hostile_id for t in tree["tasks"] for n in t["nodes"])
    assert main(["show", rs.run_id, str(rs.hostile_id), "--db", str(rs.db), "--json", "-"]) == 0
    node = json.loads(capsys.readouterr().out)
    assert node["id"] == rs.hostile_id and node["evaluations"][0]["status"] == "build_error"


def test_version_verbose_after_the_subcommand_and_defaults_in_help(rs, capsys):
    code, out = _cli("--version")
    assert code == 0 and re.fullmatch(r"forge \S+\n", out)
    assert main(["runs", "--db", str(rs.db), "-v"]) == 0  # the global option after the subcommand
    code, out = _cli("optimize", "--help")
    assert code == 0 and "(default: fp32)" in out and "(default: recipes)" not in out  # its text says it already


@pytest.mark.slow
def test_optimize_piped_prints_a_line_a_stage_and_a_task_with_the_budget_and_the_time(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "forge.cli", "optimize", str(EXAMPLES / "rmsnorm_swiglu.py"),
                           "--budget", "4", "--seconds", "10", "--no-inductor", "--db", str(tmp_path / "f.db"),
                           "--json", str(tmp_path / "o.json")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("forge: ")]
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr  # no control characters through a pipe
    stages = [x.split()[1].rstrip(":;") for x in lines if not x.startswith("forge: task ")]
    assert stages == ["capture", "probe", "search", "variants", "done"], lines
    assert all(re.search(r"\(\d+:\d\d elapsed, (~\d+:\d\d left|\d+:\d\d over)\)$", x) for x in lines), lines
    assert "budget 4 candidates, at most 4 a task" in lines[1]
    rep = json.loads((tmp_path / "o.json").read_text())
    searched = [t for t in rep["tasks"] if t["status"] != "not mine" and not t["stop_reason"].startswith("share")]
    done = [x for x in lines if x.startswith("forge: task ")]
    assert len(done) == len(searched) and searched, lines  # a line per finished task, with its share of the budget
    for t in searched:
        line = next(x for x in done if x.startswith(f"forge: task {t['key']}: {t['candidates']} candidates"))
        assert re.search(r"\(\d/4 in all\); stopped: ", line) and t["stop_reason"] in line
    n = sum(t["candidates"] for t in rep["tasks"])
    assert f"forge: done; {n}/4 candidates (" in lines[-1]


def test_a_terminal_shows_the_stage_the_budget_the_time_and_each_tasks_best():
    out = io.StringIO()
    con = Console(file=out, width=100, height=20, force_terminal=True, color_system=None)
    handler = logging.StreamHandler(out)
    logging.getLogger().addHandler(handler)
    with terminal.RunProgress(con) as shown:
        assert shown.live
        shown.start(time.monotonic() + 60)
        shown.stage("capture")
        shown.searching({"softmax-3b83": 0, "rms-1a2b": 0}, 40, 16)
        shown.stage("probe")
        shown.task("softmax-3b83", 4, 1.77)
        shown.task_done("rms-1a2b", 2, None, "reached the roofline floor [sic]")
        shown.stage("search")
        logging.getLogger("forge.test").warning("a warning [while live]")
    assert handler.stream is out  # given back
    logging.getLogger().removeHandler(handler)
    text = ANSI.sub("", out.getvalue())
    assert text.count("a warning [while live]") == 1  # once, on a line of its own above the display:
    assert re.search(r"[\r\n]a warning \[while live\] *\n", text) and text.index("a warning") < text.rindex("search ")
    last = text[text.rindex("search "):]  # the final frame
    assert re.search(r"search .* 6/40 candidates +0:0\d elapsed, ~0:5\d left *\n", last), last
    assert re.search(r"softmax-3b83 .* 4/16 +best 1.77x", last), last
    assert re.search(r"rms-1a2b .* 2/16 +no speedup yet;", last) and "stopped: reached the" in last, last
    assert "[sic]" in last and "…" not in last  # text, never markup; folded, never cut
    assert "forge: " not in text  # no plain lines under the live display
