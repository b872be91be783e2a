"""Landlock on workers (forge.evaluate.landlock): a worker writes only beneath its own folder and to the devices
it needs. Runs as any user (Landlock needs no privilege); where forge runs as root the worker is also a user
of its own (tests/test_sandbox.py), and the file it tries is one anyone may write.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TAKEN_OVER

from forge.evaluate import landlock
from forge.evaluate.parent import Worker


@pytest.mark.skipif(landlock.abi() < 2, reason="this kernel has no Landlock that forge uses (ABI 2)")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_worker_writes_in_its_own_folder_only(device: str, open_folder: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Code in a worker's process (before any seccomp filter, which on CUDA lets such an open through) writes
    into a file anyone may write, then into its own folder: Landlock refuses the first, allows the second.
    The control, FORGE_LANDLOCK=0: both done."""
    target = open_folder / "anyone-writes"
    for setting, refused in (("1", True), ("0", False)):
        target.write_bytes(b"before")
        os.chmod(target, 0o666)
        monkeypatch.setenv("FORGE_LANDLOCK", setting)
        with Worker(device, program=(TAKEN_OVER, f"writes={target}")) as w:
            w.start()
            said = w.log_tail()
            assert (w.allowed is not None) is refused, w.allowed
            assert (f"write {target}: PermissionError" in said) is refused, said
            assert f"write {target}: done" in said or refused, said
            assert f"write {w.scratch / 'own'}: done" in said, said
        assert (target.read_bytes() == b"before") is refused
