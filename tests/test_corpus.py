"""The cheating-and-breaking corpus (tests/corpus/): every kind of broken or cheating kernel gets its status.

All kernels target one task, SiLU `y = x * sigmoid(x)` over a contiguous float32 [257, 1000] tensor, and
read the sizes from the ForgeTensor. Each file starts with `// expect: <status>` (`# expect:` for Triton)
and a one-line comment saying what the cheat is. The cpu corpus runs end to end here, through one
Evaluator whose worker must survive every crash and hang; the cuda corpus is checked statically and built
with nvcc here, and runs end to end on a GPU machine (`-m cuda`), like the Triton corpus.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from forge.capture.export import capture
from forge.evaluate.build import BuildResult, build
from forge.evaluate.checks import check
from forge.evaluate.evaluator import Evaluator
from forge.evaluate.sandbox import allowed, scrubbed_env
from forge.kernel import Candidate, EvalResult, Status, TaskSpec
from forge.tasks.cut import build_tasks

CORPUS = Path(__file__).resolve().parent / "corpus"
CPU_FILES = sorted((CORPUS / "cpu").glob("*.cpp"))
CUDA_FILES = sorted((CORPUS / "cuda").glob("*.cu"))
TRITON_FILES = sorted((CORPUS / "triton").glob("*.py"))
INT_FILES = sorted((CORPUS / "cpu_int").glob("*.cpp"))  # the integer task y = abs(x) * 2 - 1 (int32)
ALL_FILES = CPU_FILES + CUDA_FILES + TRITON_FILES + INT_FILES

# The kinds every backend's corpus must hold (file stem -> status it must get).
C_KINDS = {
    "good": "ok", "build_error": "build_error", "wrong_result": "wrong_result", "partial_write": "partial_write",
    "nan": "nonfinite", "segfault": "crash", "infinite_loop": "timeout", "oob_write": "out_of_bounds",
    "input_mutation": "input_mutated", "cached_result": "stale_result", "constant_output": "constant_output",
    "low_precision": "low_precision", "torch_call": "forbidden_torch", "other_thread": "forbidden_concurrency",
    "read_env_or_file": "forbidden_io", "huge_allocation": "forbidden_alloc", "timer": "forbidden_timer",
    "skip_repeat": "stale_result", "malloc_via_pointer": "forbidden_alloc", "recognises_judge": "wrong_result",
    "drift_after_judging": "wrong_result", "checks_for_poison": "wrong_result",
    # the hard input values (zeros, exp's overflow edge, large magnitudes) and the timed calls judged
    "nan_at_zero": "nonfinite", "clamps_large": "wrong_result", "overflowing_exp": "nonfinite",
    "caches_on_samples": "wrong_result", "skips_unless_poisoned": "stale_result",
    # computes only when its output address changes: kept calls must get the address the others get
    "skips_unless_kept": "wrong_result",
}
# CPU kernels whose source passes the text checks and whose built library does not (forge.evaluate.elfcheck).
BINARY_KINDS = {"pasted_system": "forbidden_io", "spaced_thread": "forbidden_concurrency",
                "macro_constructor": "forbidden_code", "exit_handler": "forbidden_code",
                "raw_syscall": "forbidden_io", "pointer_to_kill": "forbidden_io", "pasted_getenv": "forbidden_io",
                "patches_interpreter": "forbidden_code"}
# CPU-only kinds: what the text checks stop (class C of issue 13: reaching into the worker's process), and
# an input used as scratch and restored (class E: inputs are read-only during a CPU verification call).
CPU_KINDS = {"reads_proc_maps": "forbidden_io", "restores_input": "input_mutated"}
# CUDA kernels whose source passes the text checks and whose host object does not (forge.evaluate.elfcheck:
# the CUDA runtime calls a launcher may make are an allowlist).
CUDA_BINARY_KINDS = {"pasted_malloc": "forbidden_alloc", "pasted_stream": "forbidden_concurrency",
                     "resets_device": "forbidden_code", "pasted_system": "forbidden_io",
                     "macro_constructor": "forbidden_code"}
# CPU kernels that pass the text checks and the built library's: only the worker's seccomp filter stops them.
RUNTIME_KINDS = {"libc_walk": "forbidden_io", "signals_harness": "forbidden_io", "forks_at_run_time": "forbidden_io",
                 "opens_socket": "forbidden_io", "writes_build_cache": "forbidden_io"}
# CPU kernels that pass every check and try to take what the worker cannot reach: they find nothing and
# compute right (tests/test_sandbox.py shows a worker that kept root would give it to them).
ISOLATION_KINDS = {"reads_forge_environ": "ok"}
TRITON_KINDS = {"good": "ok", "torch_call": "forbidden_torch", "other_stream": "forbidden_concurrency",
                "reads_env": "forbidden_io", "uses_eval": "forbidden_code", "patches_module": "forbidden_code",
                "import_time_code": "forbidden_code", "patch_in_launch": "forbidden_code",
                "foreign_decorator": "forbidden_code", "decorator_argument_code": "forbidden_code",
                "default_argument_code": "forbidden_code", "for_target_patch": "forbidden_code"}
# Kernels of the integer task (class D of issue 13: integer inputs with negatives where the op allows them).
INT_KINDS = {"good": "ok", "assumes_nonnegative": "wrong_result", "caches_on_samples": "wrong_result"}
# Statuses the static checks give before anything is built.
STATIC = {s.value for s in Status if s.value.startswith("forbidden_")} | {Status.BAD_FORMAT.value}
# Needs the ATen headers to compile, which only a torch source tree has: the static check is its test.
NOT_BUILT = {"torch_call"}

_EXPECT = re.compile(r"^(?://|#) expect: ([a-z_]+)$")


def expected(path: Path) -> str:
    """The status a corpus file must get, from its first line."""
    m = _EXPECT.match(path.read_text().splitlines()[0])
    assert m, f"{path}: the first line must be `// expect: <status>` (`# expect:` for .py)"
    return m.group(1)


def params(paths: list[Path]) -> list[object]:
    """pytest parameters named `<backend>/<kind>`."""
    return [pytest.param(p, id=f"{p.parent.name}/{p.stem}") for p in paths]


def describe(path: Path, r: EvalResult) -> str:
    """A failure message: what was expected, what came back and why."""
    return f"{path.parent.name}/{path.name}: expected {expected(path)}, got {r.status.value}: {r.message[:500]}"


def assert_good_timing(r: EvalResult) -> None:
    """A passing candidate comes back with sane statistics and a speedup."""
    assert r.timing is not None and r.baseline is not None
    t = r.timing
    assert t.median_us > 0
    assert t.p10_us <= t.median_us <= t.p90_us
    assert t.n >= 10
    assert r.baseline.median_us > 0 and r.baseline.n >= 10
    assert isinstance(r.speedup, float) and r.speedup > 0


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    """SiLU over a float32 [257, 1000] tensor, as forge captures it (x * sigmoid(x))."""
    tasks = build_tasks(capture(torch.nn.SiLU(), [torch.randn(257, 1000)]).graph_module.graph)
    assert len(tasks) == 1
    s = TaskSpec.of(tasks[0])
    assert [m.shape for m in s.inputs + s.outputs] == [(257, 1000), (257, 1000)]
    assert all(m.dtype == "float32" for m in s.inputs + s.outputs)
    return s


# --- the corpus itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("folder", "suffix", "kinds"), [
    ("cpu", ".cpp", C_KINDS | BINARY_KINDS | RUNTIME_KINDS | CPU_KINDS | ISOLATION_KINDS),
    ("cuda", ".cu", C_KINDS | CUDA_BINARY_KINDS),
    ("triton", ".py", TRITON_KINDS), ("cpu_int", ".cpp", INT_KINDS)])
def test_corpus_is_complete(folder: str, suffix: str, kinds: dict[str, str]) -> None:
    files = sorted((CORPUS / folder).iterdir())
    assert [p.suffix for p in files] == [suffix] * len(files), f"only {suffix} files belong in corpus/{folder}"
    assert {p.stem: expected(p) for p in files} == kinds


@pytest.mark.parametrize("path", params(ALL_FILES + sorted((CORPUS / "env_probe").iterdir())))
def test_corpus_file_header(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert expected(path) in {s.value for s in Status}
    comment = "#" if path.suffix == ".py" else "//"
    assert lines[1].startswith(comment + " ") and len(lines[1]) > len(comment) + 10, \
        "the second line says what the cheat is"
    source = "\n".join(lines[2:])
    assert not re.search(r"\b(257|1000|257000)\b", source), "a kernel reads the sizes, never hard-codes them"


@pytest.mark.parametrize("path", params(ALL_FILES))
def test_corpus_static_checks(path: Path) -> None:
    """Static kinds are rejected by forge.evaluate.checks with their status first; no other file has any finding."""
    findings = check(Candidate.from_file(path))
    want = expected(path)
    binary = CUDA_BINARY_KINDS if path.suffix == ".cu" else BINARY_KINDS
    if path.stem in binary or path.stem in RUNTIME_KINDS:
        assert findings == [], f"{path.name} is meant to pass the text checks: {findings}"
    elif want in STATIC:
        assert findings, f"{path.name}: the static checks found nothing"
        assert findings[0][0].value == want, findings
    else:
        assert findings == [], findings


# --- cpu: end to end --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluator]:
    """One evaluator (one worker, restarted as needed) for the whole cpu corpus."""
    with Evaluator("cpu", timeout_s=15, cache_dir=tmp_path_factory.mktemp("forge-cpu")) as ev:
        yield ev


@pytest.mark.parametrize("path", params(CPU_FILES))
def test_cpu_corpus(path: Path, spec: TaskSpec, cpu_evaluator: Evaluator) -> None:
    r = cpu_evaluator.evaluate(spec, Candidate.from_file(path))
    assert r.status.value == expected(path), describe(path, r)
    if path.stem == "good":
        assert_good_timing(r)


def test_the_same_binary_loaded_again_starts_fresh(spec: TaskSpec, cpu_evaluator: Evaluator) -> None:
    """Two candidates that differ in a comment build to one binary: each is loaded as a fresh instance, so the
    second does not find the first one's statics (cached_result would then fail on set 0 as wrong_result)."""
    source = (CORPUS / "cpu" / "cached_result.cpp").read_text()
    for i in range(2):
        r = cpu_evaluator.evaluate(spec, Candidate("cpu", source + f"\n// copy {i}\n"))
        assert r.status is Status.STALE_RESULT, f"copy {i}: {r.status.value}: {r.message}"


def test_a_worker_is_replaced_after_its_loads(spec: TaskSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded libraries stay in a worker: after LOADS_PER_WORKER loads the next candidate gets a fresh one."""
    import forge.evaluate.parent

    monkeypatch.setattr(forge.evaluate.parent, "LOADS_PER_WORKER", 2)
    good = (CORPUS / "cpu" / "good.cpp").read_text()
    with Evaluator("cpu", timeout_s=15, bench=None, cache_dir=tmp_path) as ev:
        pids = []
        for i in range(3):
            assert ev.evaluate(spec, Candidate("cpu", good + f"\n// copy {i}\n")).status is Status.OK
            assert ev.worker.proc is not None
            pids.append(ev.worker.proc.pid)
    assert pids[0] == pids[1] != pids[2]


@pytest.fixture(scope="module")
def int_spec() -> TaskSpec:
    """y = abs(x) * 2 - 1 over an int32 [257, 1000] tensor, as forge captures it."""
    model = type("AbsTwice", (torch.nn.Module,), {"forward": lambda self, x: torch.abs(x) * 2 - 1})()
    x = torch.randint(-9, 9, (257, 1000), dtype=torch.int32)
    (task,) = build_tasks(capture(model, [x]).graph_module.graph)
    s = TaskSpec.of(task)
    assert [m.dtype for m in s.inputs + s.outputs] == ["int32", "int32"]
    return s


@pytest.mark.parametrize("path", params(INT_FILES))
def test_cpu_int_corpus(path: Path, int_spec: TaskSpec, cpu_evaluator: Evaluator) -> None:
    """An integer input that only arithmetic reads is drawn with negatives: a kernel right on [0, 16) only
    is a wrong_result."""
    r = cpu_evaluator.evaluate(int_spec, Candidate.from_file(path))
    assert r.status.value == expected(path), describe(path, r)
    if path.stem == "good":
        assert_good_timing(r)


@pytest.mark.parametrize("kind", sorted(RUNTIME_KINDS))
def test_only_the_seccomp_filter_stops_the_runtime_kinds(kind: str, spec: TaskSpec, tmp_path: Path) -> None:
    """Built and checked, such a kernel is clean; a worker without the filter accepts it (it ran a program
    and still computed right), so the filter is what rejects it in test_cpu_corpus."""
    from forge.evaluate.elfcheck import check_library
    from forge.evaluate.parent import Worker

    cand = Candidate.from_file(CORPUS / "cpu" / f"{kind}.cpp")
    built = build(cand, cache_dir=tmp_path)
    assert built.ok and check_library(built.path, "cpu") == []
    with Evaluator("cpu", timeout_s=15, cache_dir=tmp_path, bench=None) as ev:  # verified, not timed
        ev.worker.close()
        ev.worker = Worker("cpu", confined=False)
        assert ev.evaluate(spec, cand).status.value == "ok"


@pytest.mark.parametrize("path", params([p for p in CPU_FILES if expected(p) in STATIC
                                         and p.stem not in NOT_BUILT]))
def test_cpu_static_kinds_compile(path: Path, tmp_path: Path) -> None:
    """The statically rejected kernels are real code: only the checks stand between them and the worker."""
    built = build(Candidate.from_file(path), cache_dir=tmp_path)
    assert built.ok, built.log[-2000:]


# --- cuda: static checks and nvcc builds here, end to end on a GPU ---------------------------------------


@pytest.fixture(scope="module")
def cuda_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuildResult]:
    """Every cuda corpus file built for sm_90 with nvcc, in parallel (one compiler per core)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the cuda corpus cannot be built here")
    cache = tmp_path_factory.mktemp("forge-nvcc")
    paths = [p for p in CUDA_FILES if p.stem not in NOT_BUILT]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = pool.map(lambda p: build(Candidate.from_file(p), "sm_90", cache), paths)
        return {p.stem: r for p, r in zip(paths, results, strict=True)}


@pytest.mark.parametrize("path", params([p for p in CUDA_FILES if p.stem not in NOT_BUILT]))
def test_cuda_corpus_builds(path: Path, cuda_builds: dict[str, BuildResult]) -> None:
    """Every .cu file compiles for sm_90 (static kinds too: they are real code), except build_error."""
    built = cuda_builds[path.stem]
    if expected(path) == Status.BUILD_ERROR.value:
        assert not built.ok and "error" in built.log
    else:
        assert built.ok, built.log[-2000:]
        assert Path(built.path).stat().st_size > 0


@pytest.mark.parametrize("path", params([p for p in CUDA_FILES if p.stem not in NOT_BUILT
                                         and expected(p) != Status.BUILD_ERROR.value]))
def test_cuda_host_object_check(path: Path, cuda_builds: dict[str, BuildResult]) -> None:
    """The check of a CUDA build's host object rejects each binary kind with its status and passes every
    kernel the text checks pass (its CUDA runtime allowlist covers what a launcher needs)."""
    from forge.evaluate.elfcheck import check_library

    found = check_library(cuda_builds[path.stem].path, "cuda")
    if path.stem in CUDA_BINARY_KINDS:
        assert found and found[0][0].value == expected(path), found
    elif expected(path) in STATIC:  # rejected before building; the host object agrees where it can see it
        assert all(status.value == expected(path) for status, _ in found), found
    else:
        assert found == [], found


@pytest.fixture(scope="module")
def cuda_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluator]:
    """One evaluator for the cuda and Triton corpora on the first GPU."""
    with Evaluator("cuda", timeout_s=20, cache_dir=tmp_path_factory.mktemp("forge-cuda")) as ev:
        yield ev


@pytest.mark.cuda
@pytest.mark.parametrize("path", params(CUDA_FILES))
def test_cuda_corpus(path: Path, spec: TaskSpec, cuda_evaluator: Evaluator) -> None:
    r = cuda_evaluator.evaluate(spec, Candidate.from_file(path))
    assert r.status.value == expected(path), describe(path, r)
    if path.stem == "good":
        assert_good_timing(r)


@pytest.mark.cuda
def test_a_confined_cuda_worker_hands_python_candidates_to_an_unconfined_one(spec: TaskSpec, tmp_path: Path) -> None:
    """Under the seccomp filter (CUDA workers' default) a Triton candidate is judged by the worker's unconfined
    companion (its compiler is a program the filter would kill the worker for starting); CUDA ones stay with the
    confined worker."""
    from forge.evaluate.parent import Worker

    with Evaluator("cuda", timeout_s=60, cache_dir=tmp_path) as ev:
        ev.worker.close()
        ev.worker = Worker("cuda", confined=True)
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / "triton" / "good.py"))
        assert r.status is Status.OK, r.message
        python = ev.worker.python_worker()
        assert python.proc is not None and not python.confined  # the companion judged it
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / "cuda" / "good.cu"))
        assert r.status is Status.OK and ev.worker.proc is not None and not ev.worker.unconfined, r.message
        x = torch.randn(257, 1000, device="cuda")  # the lab's live call goes the same way
        out = ev.call(spec, Candidate.from_file(CORPUS / "triton" / "good.py"), [x])
        assert isinstance(out, tuple), out
        torch.testing.assert_close(out[0], torch.nn.functional.silu(x), rtol=1e-4, atol=1e-5)  # Triton's exp


@pytest.mark.cuda
@pytest.mark.parametrize("path", params(TRITON_FILES))
def test_triton_corpus(path: Path, spec: TaskSpec, cuda_evaluator: Evaluator) -> None:
    r = cuda_evaluator.evaluate(spec, Candidate.from_file(path))
    assert r.status.value == expected(path), describe(path, r)
    if path.stem == "good":
        assert_good_timing(r)


# --- the worker: killed mid-run, and without credentials ------------------------------------------------


def test_killing_the_worker_loses_only_that_candidate(spec: TaskSpec, tmp_path: Path) -> None:
    good = Candidate.from_file(CORPUS / "cpu" / "good.cpp")
    hang = Candidate.from_file(CORPUS / "cpu" / "infinite_loop.cpp")
    with Evaluator("cpu", timeout_s=15, bench=None, cache_dir=tmp_path) as ev:
        assert ev.evaluate(spec, good).status is Status.OK  # the worker is up
        assert ev.builds.submit(hang).result().ok  # built ahead: the request goes out at once
        proc = ev.worker.proc
        assert proc is not None
        results: list[EvalResult] = []
        thread = threading.Thread(target=lambda: results.append(ev.evaluate(spec, hang)))
        start = time.monotonic()
        thread.start()
        time.sleep(1.0)
        assert proc.poll() is None, "the worker died by itself"
        os.kill(proc.pid, signal.SIGKILL)
        thread.join(30)
        assert not thread.is_alive()
        (r,) = results
        assert r.status in (Status.CRASH, Status.TIMEOUT), r
        if r.status is Status.CRASH:
            assert "SIGKILL" in r.message
            assert time.monotonic() - start < 10, "a killed worker is noticed at once, not at the time limit"
        after = ev.evaluate(spec, good)
        assert after.status is Status.OK, after.message
        assert ev.worker.proc is not None and ev.worker.proc.pid != proc.pid
        assert ev.worker.restarts == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/environ")
def test_worker_env_is_an_allowlist(spec: TaskSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"OPENAI_API_KEY": "sk-test-123", "HF_TOKEN": "hf_test_456", "MY_DB_PASS": "hunter2",
               "DATABASE_URL": "postgresql://u:pw123@db/x", "FORGE_DB": "postgresql://u:pw456@db/y",
               "UNRELATED_SETTING": "not-on-the-allowlist"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    env = scrubbed_env({"FORGE_TEST_EXTRA": "1"})
    assert not set(secrets) & set(env)
    assert not set(secrets.values()) & set(env.values())
    assert env["FORGE_TEST_EXTRA"] == "1" and env["PATH"] == os.environ["PATH"]
    assert all(not allowed(name) for name in secrets)
    assert allowed("OMP_NUM_THREADS") and allowed("CUDA_VISIBLE_DEVICES") and not allowed("CUDA_AUTH_TOKEN")

    with Evaluator("cpu", timeout_s=15, bench=None, cache_dir=tmp_path) as ev:
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / "env_probe" / "probe.cpp"))
        assert r.status is Status.OK, r.message
        assert ev.worker.proc is not None and ev.worker.proc.poll() is None
        raw = Path(f"/proc/{ev.worker.proc.pid}/environ").read_bytes()
    names = {e.split(b"=", 1)[0].decode() for e in raw.split(b"\0") if e}
    home = next(e.split(b"=", 1)[1].decode() for e in raw.split(b"\0") if e.startswith(b"HOME="))
    assert home == str(ev.worker.scratch) and home != os.environ.get("HOME")  # its own folder, not the user's home
    assert "PATH" in names  # it is the real environment
    for name, value in secrets.items():
        assert name.encode() not in raw
        assert value.encode() not in raw
    forges = ("PYTHONPATH", "PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR")  # forge's own settings (worker_env)
    assert not sorted(n for n in names if not allowed(n) and n not in forges)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="a network namespace needs Linux and root (where it cannot be made, workers run without)")
def test_a_root_worker_has_no_network(spec: TaskSpec, tmp_path: Path) -> None:
    """A worker started by root lives in a network namespace of its own: no interface but a loopback, down
    (a Python candidate's CUDA worker has no seccomp filter to refuse sockets: this is what keeps it off the
    network)."""
    from forge.evaluate.parent import Worker
    from forge.evaluate.sandbox import network_namespace

    with Worker("cpu", confined=False) as w:
        w._start()
        assert w.proc is not None
        if not w.own_network:
            pytest.skip("this system refused the namespace (a container without CAP_SYS_ADMIN)")
        assert network_namespace(w.proc.pid) != network_namespace()
        devices = Path(f"/proc/{w.proc.pid}/net/dev").read_text().splitlines()[2:]
        assert [d.split(":")[0].strip() for d in devices] == ["lo"]
        assert Path(f"/proc/{w.proc.pid}/net/route").read_text().splitlines()[1:] == []  # no route anywhere


def test_a_cuda_worker_gets_the_network_namespace_and_the_filter_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA worker's sandbox settings (nothing started: no GPU needed): the namespace unless
    FORGE_CUDA_SANDBOX=0, the seccomp filter unless FORGE_CUDA_SECCOMP=0; a confined one sends Python candidates
    to one unconfined worker of its own, with its namespace, closed with it."""
    from forge.evaluate.parent import Worker

    monkeypatch.delenv("FORGE_CUDA_SANDBOX", raising=False)
    monkeypatch.delenv("FORGE_CUDA_SECCOMP", raising=False)
    with Worker("cuda") as w:
        assert w.isolate_network and w.confined
        assert w.refuses("triton") and w.refuses("helion") and not w.refuses("cuda")
        python = w.python_worker()
        assert python is w.python_worker() and python.device == "cuda" and python.isolate_network
        assert not python.confined and not python.refuses("triton")
        # no cache file to create under the filter: the driver's PTX cache, PyTorch's jiterator cache
        assert w.env()["CUDA_CACHE_DISABLE"] == "1" and w.env()["USE_PYTORCH_KERNEL_CACHE"] == "0"
        assert "USE_PYTORCH_KERNEL_CACHE" not in python.env()
    assert python._closed
    monkeypatch.setenv("FORGE_CUDA_SANDBOX", "0")
    monkeypatch.setenv("FORGE_CUDA_SECCOMP", "0")
    w = Worker("cuda")
    assert not w.isolate_network and not w.confined and not w.refuses("triton")
    assert Worker("cpu").isolate_network and Worker("cpu").confined  # the CPU worker's, whatever the variables say


@pytest.mark.cuda
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="giving up root needs root")
@pytest.mark.parametrize("name", ["cuda/good.cu", "triton/good.py", "cuda/wrong_result.cu", "cuda/oob_write.cu"])
def test_a_cuda_worker_started_by_root_gives_it_up_and_judges_as_before(name: str, spec: TaskSpec,
                                                                          tmp_path: Path) -> None:
    """Since the CUDA arena is shared as a file descriptor (forge.evaluate.devmem), a CUDA worker, and the one
    that judges its Python candidates, give up root as CPU workers do (each a user id of its own)."""
    from forge.evaluate.parent import Worker

    with Evaluator("cuda", timeout_s=60, cache_dir=tmp_path) as ev:
        ev.worker.close()
        ev.worker = Worker("cuda")
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / name))
        assert r.status.value == expected(CORPUS / name), r.message
        judged = ev.worker.python_worker() if name.endswith(".py") else ev.worker
        assert judged.privileged == "" and judged.drop is not None and judged.uid == judged.drop.uid != 0
        assert judged is ev.worker or ev.worker.drop is not None and judged.uid != ev.worker.drop.uid


@pytest.mark.cuda
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="a network namespace needs root")
@pytest.mark.parametrize("name", ["cuda/good.cu", "triton/good.py", "cuda/wrong_result.cu"])
def test_a_cuda_worker_in_its_own_network_namespace_judges_as_before(name: str, spec: TaskSpec, tmp_path: Path) -> None:
    """What holds since CUDA workers get a network namespace by default: CUDA, Triton and the shared arena
    work inside one (on an H200 at 4288f8d all three passed)."""
    from forge.evaluate.parent import Worker

    with Evaluator("cuda", timeout_s=60, cache_dir=tmp_path) as ev:
        ev.worker.close()
        ev.worker = Worker("cuda", own_network=True)
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / name))
        assert r.status.value == expected(CORPUS / name), r.message
        judged = ev.worker.python_worker() if name.endswith(".py") else ev.worker  # Triton: the unconfined one
        if not judged.own_network:
            pytest.skip("this system refused the namespace")
