"""The worker's sandbox when forge runs as root (forge.evaluate.privilege): it gives up root, and what it loads
comes from a folder of its own, never from the build cache, which it cannot write.

Each attack is a real corpus kernel on a real worker without its seccomp filter (the filter would kill it
first, hiding what the user change does); the control runs it in a worker that kept root and shows the
attack works there.
"""

from __future__ import annotations

import os
import pwd
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TAKEN_OVER

from forge.capture.export import capture
from forge.evaluate.build import build
from forge.evaluate.evaluator import Evaluator
from forge.evaluate.parent import Worker
from forge.evaluate.privilege import plan
from forge.evaluate.sandbox import process_uid
from forge.kernel import Candidate, Status, TaskSpec
from forge.tasks.cut import build_tasks

CORPUS = Path(__file__).resolve().parent / "corpus" / "cpu"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="a worker gives up root only when forge runs as root (Linux)")


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    """SiLU over a float32 [257, 1000] tensor (the corpus's task)."""
    (task,) = build_tasks(capture(torch.nn.SiLU(), [torch.randn(257, 1000)]).graph_module.graph)
    return TaskSpec.of(task)


@pytest.fixture
def cache(open_folder: Path) -> Path:
    """A build cache any user can reach: what keeps a worker out is its permissions alone."""
    return open_folder


def judged(spec: TaskSpec, name: str, cache: Path, unprivileged: bool) -> tuple[Status, int | None]:
    """A corpus kernel's status and the user id of the worker (no seccomp filter) that ran it."""
    with Evaluator("cpu", timeout_s=30, cache_dir=cache, bench=None) as ev:
        ev.worker.close()
        ev.worker = Worker("cpu", confined=False, unprivileged=unprivileged)
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / f"{name}.cpp"))
        return r.status, ev.worker.uid


def _no_account(uid: int | None) -> bool:
    """A user id no account has: a worker's own (privilege.fresh_id)."""
    try:
        pwd.getpwuid(uid or 0)
        return False
    except KeyError:
        return True


def test_a_root_worker_gives_up_root() -> None:
    with Worker("cpu") as w:
        w.start()
        assert w.proc is not None and w.privileged == ""
        status = Path(f"/proc/{w.proc.pid}/status").read_text()
        uid = w.uid
        assert _no_account(uid), uid
        assert "NoNewPrivs:\t1" in status  # no setuid program gives root back
        assert f"Uid:\t{uid}\t{uid}\t{uid}" in status and f"Gid:\t{uid}\t{uid}\t{uid}" in status
    # a user no account has still has a name: getpass.getuser() (Inductor's, on Helion's import) would ask pwd
    with Worker("cpu", program=(TAKEN_OVER, "who")) as w:
        w.start()
        assert f"user: worker-{w.uid}" in w.log_tail(), w.log_tail()
    with Worker("cpu", unprivileged=False) as w:
        w.start()
        assert w.uid == 0 and w.privileged


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_worker_that_gave_up_root_cannot_open_forges_memory(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code in a worker's process opens /proc/<forge>/mem for writing (where it could rewrite the judge; before
    the filter, which on CUDA lets such an open through):
    refused when it gave up root, a CUDA worker too (its arena comes over a socket, forge.evaluate.devmem);
    the control, a worker that kept root, opens it where Landlock is off (Landlock refuses even root that)."""
    monkeypatch.setenv("FORGE_LANDLOCK", "0")
    for unprivileged in (True, False):
        with Worker(device, program=(TAKEN_OVER, "opens-judge-memory"), unprivileged=unprivileged) as w:
            w.start()
            said = w.log_tail()
            assert (_no_account(w.uid) if unprivileged else w.uid == 0), (w.uid, w.privileged, said)
            assert ("judge memory: opened" in said) is not unprivileged, said
            assert "judge memory:" in said


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_worker_cannot_signal_another_workers_process(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code in one worker's process asks to signal another worker (signal 0: the permission check alone, no
    harm done). Each worker has a user id of its own: refused. The control, both as `nobody` (a shared
    account, as before 2026-12-06 evening): allowed, though hidepid hides the other from /proc."""
    for user, allowed in (("unique", False), ("nobody", True)):
        monkeypatch.setenv("FORGE_WORKER_USER", user)
        with Worker(device) as other:
            other.start()
            assert other.proc is not None and other.uid != 0, other.privileged
            with Worker(device, program=(TAKEN_OVER, f"signals-pid={other.proc.pid}")) as w:
                w.start()
                said = w.log_tail()
                assert w.uid != 0 and (w.uid == other.uid) is allowed, (w.uid, other.uid, w.privileged)
                assert ("signal: sent" in said) is allowed and "signal:" in said, said


def test_what_a_worker_left_running_dies_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process a candidate left running in a session of its own would live on as the user of the worker's next
    candidate: stopping a worker of its own user id kills every process of that id. The control, `nobody`
    (shared, so not killed so): it lives on, and the test kills it."""
    for user, killed in (("unique", True), ("nobody", False)):
        monkeypatch.setenv("FORGE_WORKER_USER", user)
        with Worker("cpu", program=(TAKEN_OVER, "leaves-daemon")) as w:
            w.start()
            said = w.log_tail()
            pid = int(said.split("daemon: ")[1].split()[0])
            assert process_uid(pid) == w.uid != 0, said
        time.sleep(0.5)
        alive = Path(f"/proc/{pid}").exists() and "State:\tZ" not in _status(pid)
        if alive and process_uid(pid) == w.uid:  # the same process still, not a pid used again
            os.kill(pid, 9)
        assert alive is not killed, user


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def test_a_worker_that_gave_up_root_cannot_read_forges_environment(spec: TaskSpec, cache: Path) -> None:
    """reads_forge_environ puts whatever it reads of /proc/<forge>/environ into its output."""
    status, uid = judged(spec, "reads_forge_environ", cache, unprivileged=True)
    assert status is Status.OK and _no_account(uid), (status, uid)
    status, uid = judged(spec, "reads_forge_environ", cache, unprivileged=False)
    assert uid == 0 and status in (Status.STALE_RESULT, Status.WRONG_RESULT), status  # root reads it


def test_a_worker_cannot_write_the_build_cache(spec: TaskSpec, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writes_build_cache plants a file in $FORGE_CACHE/builds; the worker loads its library from a copy in
    a folder of its own, and the cache's folders are forge's user's to write."""
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    planted = cache / "builds" / "planted.so"
    assert judged(spec, "writes_build_cache", cache, unprivileged=True)[0] is Status.OK
    assert not planted.exists()
    built = build(Candidate.from_file(CORPUS / "writes_build_cache.cpp"), cache_dir=cache)
    assert built.cached and oct(Path(built.path).stat().st_mode & 0o777) == oct(0o644)
    assert oct(Path(built.path).parent.stat().st_mode & 0o777) == oct(0o755)
    monkeypatch.setenv("FORGE_LANDLOCK", "0")  # else Landlock refuses even a root worker
    assert judged(spec, "writes_build_cache", cache, unprivileged=False)[0] is Status.OK
    assert planted.read_bytes() == b"planted"  # the control: a root worker writes it


def test_a_folder_the_worker_cannot_traverse_is_masked(tmp_path: Path) -> None:
    """A path the worker needs under a folder only root may enter (a virtual environment under /root) is
    shown again inside an empty tmpfs over that folder; one it cannot read is a reason to keep root."""
    nobody = pwd.getpwnam("nobody")
    closed = tmp_path / "closed"
    (closed / "venv").mkdir(parents=True)
    os.chmod(closed, 0o700)
    os.chmod(closed / "venv", 0o755)
    os.chmod(tmp_path, 0o755)
    drop = plan(nobody.pw_uid, nobody.pw_gid, "nobody", [str(closed / "venv")])
    assert not isinstance(drop, str)
    assert drop.shown == (str(closed / "venv"),)
    assert all(str(closed).startswith(m) for m in drop.masks) and drop.masks
    (closed / "secret").mkdir(mode=0o700)
    reason = plan(nobody.pw_uid, nobody.pw_gid, "nobody", [str(closed / "secret")])
    assert isinstance(reason, str) and "not readable" in reason
