"""Build: candidate source -> shared library (cpu: g++, cuda: nvcc), cached by content key.

Builds are compiler processes run in parallel from a thread pool (one per CPU core), each with a time
limit and a scrubbed environment, in forge's own process: the cache is written by forge's compilers only,
never by a worker (which loads a copy: forge.evaluate.parent.Worker.stage), and its folders and files are
made not writable by other users (a worker that gave up root: forge.evaluate.privilege). The cache key
covers the source, entry, flags, compiler version, target architecture and the ABI header, so a hit is
always the same binary; each build records the SHA-256 of its file (`kernel.sha256`; a CUDA build also
keeps its host object, `host.o`, which forge.evaluate.elfcheck reads, with `host.sha256`), checked on every
hit: a cached file that changed since it was built (another process wrote over it) or has no record is
built again. Triton candidates are compiled by Triton inside the worker on first launch; their "build" only
stores the module file.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from forge.backends import BACKENDS
from forge.evaluate.elfcheck import HOST_OBJECT
from forge.evaluate.sandbox import scrubbed_env
from forge.kernel import ABI_DIR, Candidate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """A built candidate: the library (or module) path, or the compiler's log on failure."""

    ok: bool
    path: str
    log: str
    seconds: float
    cached: bool
    key: str


def default_cache_dir() -> Path:
    """`$FORGE_CACHE`, else `$XDG_CACHE_HOME/forge`, else `~/.cache/forge`."""
    if os.environ.get("FORGE_CACHE"):
        return Path(os.environ["FORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forge"


@functools.cache
def compiler(backend: str) -> tuple[str, str]:
    """(path, version line) of the backend's compiler; raises FileNotFoundError when missing."""
    b = BACKENDS[backend]
    name = os.environ.get("CXX", b.compiler) if b.compiler == "g++" else b.compiler
    path = shutil.which(name)
    if path is None and name == "nvcc" and Path("/usr/local/cuda/bin/nvcc").exists():
        path = "/usr/local/cuda/bin/nvcc"
    if path is None:
        raise FileNotFoundError(f"no {name} found for the {backend} backend")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return path, (lines[-1] if name == "nvcc" else lines[0]) if lines else "unknown"  # nvcc's last line names it


def arch_flags(arch: str) -> list[str]:
    """nvcc flags for an architecture like "sm_90": Hopper gets sm_90a (wgmma, TMA)."""
    if arch in ("sm_90", "sm_90a"):
        return ["-gencode", "arch=compute_90a,code=sm_90a"]
    return [f"-arch={arch}"]


# in the key: a change of steps is a new build
_STEPS = "compile with the optimisation report, then link without the candidate's flags; CUDA: keep host.o"


def commands(candidate: Candidate, src: Path, out: Path, arch: str | None) -> list[list[str]]:
    """The compiler command lines for a candidate, run in order. On the CPU the library is compiled to an
    object with the candidate's flags and linked without them: linking with -ffast-math would add GCC's
    crtfastmath constructor, which sets flush-to-zero for the whole process that loads the library (the
    user's, at dispatch)."""
    path, version = compiler(candidate.backend)
    if BACKENDS[candidate.backend].device == "cpu":
        obj = out.with_suffix(".o")
        return [[path, "-x", "c++", "-std=c++17", "-O3", "-march=native", "-fopenmp", "-fPIC", "-c",
                 f"-I{ABI_DIR}", *report_flags(version), *candidate.flags, "-o", str(obj), str(src)],
                [path, "-shared", "-fopenmp", "-o", str(out), str(obj)]]
    # CUDA: compiled to a host object first, which the library check reads (forge.evaluate.elfcheck: the
    # library links the CUDA runtime statically, whose own imports would hide the kernel's)
    obj = out.with_name(HOST_OBJECT)
    return [[path, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xptxas", "-v", *arch_flags(arch or "sm_90"),
             f"-I{ABI_DIR}", *candidate.flags, "-c", "-o", str(obj), str(src)],
            [path, "-shared", *arch_flags(arch or "sm_90"), "-o", str(out), str(obj)]]


def report_flags(version: str) -> list[str]:
    """The compiler's vectorisation report (which loops were vectorised, which not and why), into the build
    log: GCC's -fopt-info, Clang's -Rpass; nothing for another compiler."""
    if "clang" in version.lower():
        return ["-Rpass=loop-vectorize", "-Rpass-missed=loop-vectorize"]
    if "g++" in version or "gcc" in version.lower():
        return ["-fopt-info-vec-optimized-missed"]
    return []


def build_key(candidate: Candidate, arch: str | None) -> str:
    """Content key of a build: source, entry, flags, compiler version, architecture, ABI header."""
    h = hashlib.sha256(candidate.digest.encode())
    if BACKENDS[candidate.backend].native:
        h.update(compiler(candidate.backend)[1].encode())
        h.update(str(arch).encode())
        h.update(_STEPS.encode())
    h.update((ABI_DIR / "forge_abi.h").read_bytes())
    return h.hexdigest()[:24]


def build(candidate: Candidate, arch: str | None = None, cache_dir: Path | None = None,
          timeout_s: float = 180.0) -> BuildResult:
    """Build one candidate (or find it in the cache). Failures are values, never exceptions."""
    start = time.perf_counter()
    cache_dir = cache_dir or default_cache_dir()
    try:
        key = build_key(candidate, arch)
    except (FileNotFoundError, subprocess.SubprocessError) as e:
        return BuildResult(False, "", f"toolchain unavailable: {e}", 0.0, False, "")
    folder = cache_dir / "builds" / key
    b = BACKENDS[candidate.backend]
    suffix, target = b.suffix, folder / b.artifact
    host = _keeps_host(candidate.backend)
    hit = _hit(folder, target, key, start, host)
    if hit is not None:
        return hit
    if target.exists():
        log.warning("cached build %s changed since it was built (or has no hash): building it again", key)
    _folder(folder)
    tmp = folder / f"tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        src = tmp / f"kernel{suffix}"
        src.write_text(candidate.source)
        if not b.native:  # a Python module: nothing to compile
            _install(src, target, "kernel.sha256")
            return BuildResult(True, str(target), "", time.perf_counter() - start, False, key)
        out = tmp / b.artifact
        ok, text = _compile(commands(candidate, src, out, arch), tmp, timeout_s)
        ok = ok and out.exists() and (not host or (tmp / HOST_OBJECT).exists())
        if ok:
            (tmp / "build.log").write_text(text)
            _install(tmp / "build.log", folder / "build.log")
            if host:
                _install(tmp / HOST_OBJECT, folder / HOST_OBJECT, "host.sha256")
            _install(out, target, "kernel.sha256")  # last, atomic: a concurrent build of the same key is harmless
        return BuildResult(ok, str(target) if ok else "", text, time.perf_counter() - start, False, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


BUILD_NICE = 10  # the compilers' niceness: a worker timing a candidate gets its CPU back from them at once


def _niced(cmd: list[str]) -> list[str]:
    """`cmd` run at niceness BUILD_NICE (through nice(1), where there is one): the worker that times candidates
    beside the compilers comes first. (On an H100's 16 cores, one compiler loop a core at niceness 0 did not move
    the timings measured: benchmarks/launch_path.py; this keeps it so where cores are fewer.)"""
    nice = shutil.which("nice")
    return [nice, "-n", str(BUILD_NICE), *cmd] if nice else cmd


def _compile(cmds: list[list[str]], cwd: Path, timeout_s: float) -> tuple[bool, str]:
    """Run the compiler commands in order until one fails: whether all succeeded, and their log."""
    text, ok = "", True
    for cmd in cmds:
        try:
            # its own session: Ctrl-C reaches forge only, so a compiler it interrupts is no build error
            proc = subprocess.run(_niced(cmd), capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                                  env=scrubbed_env(), stdin=subprocess.DEVNULL, start_new_session=True)
            text += f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:
            text, ok = text + f"$ {' '.join(cmd)}\ncompiler timed out after {timeout_s:.0f} s", False
        if not ok:
            break
    return ok, text


def _folder(folder: Path) -> None:
    """The build's folder and the cache's `builds` folder, made not writable by other users (a worker)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in (folder.parent, folder):
        try:
            os.chmod(f, 0o755)
        except OSError:  # a shared cache made by another user: theirs to keep
            pass


def _install(file: Path, target: Path, record: str = "") -> None:
    """Move a finished file into its build folder, readable by all and writable by forge's user only; with
    `record`, its SHA-256 written first under that name."""
    os.chmod(file, 0o644)
    if record:
        _record(file, target.parent, record)
    os.replace(file, target)


def cached(candidate: Candidate, arch: str | None = None, cache_dir: Path | None = None) -> BuildResult | None:
    """The candidate's build if the cache holds it intact, else None (nothing is built)."""
    start = time.perf_counter()
    try:
        key = build_key(candidate, arch)
    except (FileNotFoundError, subprocess.SubprocessError):
        return None
    folder = (cache_dir or default_cache_dir()) / "builds" / key
    return _hit(folder, folder / BACKENDS[candidate.backend].artifact, key, start, _keeps_host(candidate.backend))


def _keeps_host(backend: str) -> bool:
    """Whether a backend's build keeps its host object (CUDA: forge.evaluate.elfcheck reads it)."""
    b = BACKENDS[backend]
    return b.native and b.device == "cuda"


def _hit(folder: Path, target: Path, key: str, start: float, host: bool = False) -> BuildResult | None:
    """The build in `folder` if its file (and with `host`, a CUDA build's host object) is there and matches its
    recorded SHA-256."""
    for file, record in ((target, "kernel.sha256"), *(((folder / HOST_OBJECT, "host.sha256"),) if host else ())):
        if not file.exists() or _read(folder / record).strip() != file_sha256(file):
            return None
    return BuildResult(True, str(target), _read(folder / "build.log"), time.perf_counter() - start, True, key)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, in hex (read in blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record(built: Path, folder: Path, record: str = "kernel.sha256") -> None:
    """Write the SHA-256 of a finished build next to where it goes (atomically, before the file itself)."""
    tmp = built.with_suffix(".sha256")
    tmp.write_text(file_sha256(built) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, folder / record)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class BuildPool:
    """Builds candidates in parallel, one compiler process per CPU core at most."""

    def __init__(self, workers: int | None = None, arch: str | None = None,
                 cache_dir: Path | None = None) -> None:
        self.arch = arch
        self.cache_dir = cache_dir
        self.workers = workers or os.cpu_count() or 1
        self.pool = cf.ThreadPoolExecutor(max_workers=self.workers,
                                          thread_name_prefix="forge-build")

    def submit(self, candidate: Candidate) -> cf.Future[BuildResult]:
        """Start a build; the future's result is a BuildResult. A cached build is answered at once, here: it
        never waits behind compilers of other candidates."""
        hit = cached(candidate, self.arch, self.cache_dir)
        if hit is not None:
            done: cf.Future[BuildResult] = cf.Future()
            done.set_result(hit)
            return done
        return self.pool.submit(build, candidate, self.arch, self.cache_dir)

    def close(self) -> None:
        """Wait for running builds and stop the threads."""
        self.pool.shutdown(wait=True, cancel_futures=True)
