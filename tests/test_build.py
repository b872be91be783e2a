"""Builds: real compiler runs, cached by content key, failures as values."""

import shutil

import pytest
from conftest import MODELS

from forge.evaluate.build import BuildPool, build, build_key
from forge.kernel import Candidate

GOOD = (MODELS.parent / "kernels" / "relu_good.cpp").read_text()


def test_second_build_is_a_cache_hit_and_keys_follow_content(tmp_path):
    cand = Candidate("cpu", GOOD)
    first = build(cand, cache_dir=tmp_path)
    assert first.ok and not first.cached and first.path.endswith(".so")
    again = build(cand, cache_dir=tmp_path)
    assert again.ok and again.cached and again.path == first.path and again.seconds < first.seconds
    assert build_key(cand, None) != build_key(Candidate("cpu", GOOD, flags=("-DX=1",)), None)
    assert build_key(cand, None) != build_key(Candidate("cpu", GOOD + "\n"), None)


def test_a_cached_build_that_changed_or_lost_its_hash_is_built_again(tmp_path):
    import hashlib
    from pathlib import Path

    cand = Candidate("cpu", GOOD)
    first = build(cand, cache_dir=tmp_path)
    lib, record = Path(first.path), Path(first.path).parent / "kernel.sha256"
    assert record.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    lib.write_bytes(lib.read_bytes() + b"planted")  # another process wrote over the cached library
    again = build(cand, cache_dir=tmp_path)
    assert again.ok and not again.cached and b"planted" not in lib.read_bytes()
    assert record.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    record.unlink()
    assert not build(cand, cache_dir=tmp_path).cached
    assert build(cand, cache_dir=tmp_path).cached


def test_a_cached_build_is_not_writable_by_other_users(tmp_path):
    """A worker that gave up root (forge.evaluate.privilege) cannot change a build another cache hit trusts."""
    from pathlib import Path

    lib = Path(build(Candidate("cpu", GOOD), cache_dir=tmp_path).path)
    for f in (lib, lib.parent / "kernel.sha256", lib.parent / "build.log"):
        assert f.stat().st_mode & 0o777 == 0o644, f
    for d in (lib.parent, lib.parent.parent):
        assert d.stat().st_mode & 0o777 == 0o755, d


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_cuda_build_keeps_its_host_object_hashed(tmp_path):
    """The host object forge.evaluate.elfcheck reads is kept with its own hash: one changed since is built again."""
    import hashlib
    from pathlib import Path

    cand = Candidate.from_file(MODELS.parent / "corpus" / "cuda" / "good.cu")
    first = build(cand, "sm_90", tmp_path)
    host = Path(first.path).parent / "host.o"
    assert first.ok
    assert (host.parent / "host.sha256").read_text().strip() == hashlib.sha256(host.read_bytes()).hexdigest()
    assert build(cand, "sm_90", tmp_path).cached
    host.write_bytes(host.read_bytes() + b"planted")
    again = build(cand, "sm_90", tmp_path)
    assert again.ok and not again.cached and b"planted" not in host.read_bytes()


def test_build_error_is_a_value_with_the_compiler_log(tmp_path):
    res = build(Candidate("cpu", GOOD.replace("return 0;", "return 0")), cache_dir=tmp_path)
    assert not res.ok and "error" in res.log and res.path == ""
    assert not list((tmp_path / "builds").glob("*/kernel.so"))  # nothing cached for a failure


def test_pool_builds_in_parallel(tmp_path):
    pool = BuildPool(workers=2, cache_dir=tmp_path)
    futures = [pool.submit(Candidate("cpu", GOOD + f"\n// variant {i}\n")) for i in range(3)]
    results = [f.result() for f in futures]
    pool.close()
    assert all(r.ok for r in results) and len({r.key for r in results}) == 3


def test_a_cached_build_is_answered_while_the_pool_is_busy_compiling(tmp_path, monkeypatch):
    """A hit never queues behind compilers: with the pool's only thread held by a build that waits, the cached
    candidate's future is done at once (forge lab's other entries run while one compiles)."""
    import threading

    from forge.evaluate import build as build_module

    cand = Candidate("cpu", GOOD)
    assert build(cand, cache_dir=tmp_path).ok
    release, started = threading.Event(), threading.Event()
    real = build_module.build

    def held(c, *args, **kw):
        started.set()
        release.wait(60)
        return real(c, *args, **kw)

    monkeypatch.setattr(build_module, "build", held)
    pool = BuildPool(workers=1, cache_dir=tmp_path)
    try:
        busy = pool.submit(Candidate("cpu", GOOD + "\n// another\n"))
        assert started.wait(60)
        hit = pool.submit(cand)
        assert hit.done() and hit.result().cached and not busy.done()
    finally:
        release.set()
        pool.close()
    assert busy.result().ok and not busy.result().cached
