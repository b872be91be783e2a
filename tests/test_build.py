"""Builds: real compiler runs, cached by content key, failures as values."""

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
