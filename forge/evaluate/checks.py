"""Static checks on a candidate's source before it is built: each broken rule is a clear reason.

Rules (docs/kernel-abi.md): no calls into PyTorch/ATen compute; no memory allocation; no streams or
threads other than the given stream (cuda) and OpenMP (cpu); no files, environment, network or
processes; no timer tampering or code that runs at load. The worker's sandbox and the verifier catch
what text patterns miss; these checks give the reason early and clearly.
"""

from __future__ import annotations

import ast
import re

from forge.backends import BACKENDS, TRITON, Backend
from forge.evaluate.tilechecks import check_tile_kernels
from forge.kernel import Candidate, Status

# (status, rule, regex) for C, C++ and CUDA sources; matched after comments are stripped. Names that
# are also common words need a call's "(", the others match anywhere (a function pointer too).
_C_RULES: list[tuple[Status, str, str]] = [
    (Status.FORBIDDEN_TORCH, "calls into PyTorch/ATen",
     r"#\s*include\s*[<\"](torch|ATen|c10)/|\b(at|torch|c10)::"),
    (Status.FORBIDDEN_ALLOC, "allocates memory",
     r"(?<![A-Za-z0-9])_*(builtin_)?(malloc|calloc|realloc|posix_memalign|aligned_alloc|valloc|alloca|"
     r"cudaMalloc\w*|cudaHostAlloc|cudaMallocHost|mmap|sbrk|operator\s+new)\b|\bnew\s+[A-Za-z_]|"
     r"\bstd::(vector|unique_ptr|shared_ptr|make_unique|make_shared|allocator)\b"),
    (Status.FORBIDDEN_CONCURRENCY, "creates streams or threads",
     r"\b(cudaStreamCreate\w*|cudaStreamPerThread|pthread_create|std::thread|std::async|std::jthread|"
     r"vfork|cudaLaunchHostFunc|cudaStreamAddCallback)\b|\b(fork|clone)\s*\("),
    (Status.FORBIDDEN_IO, "touches files, environment, network or processes",
     r"(?<![A-Za-z0-9])_*(fopen|freopen|openat|ifstream|ofstream|fstream|getenv|secure_getenv|environ|setenv|putenv|"
     r"popen|execl|execlp|execle|execv|execvp|execve|dlopen|dlsym|syscall|ptrace|unlink)\b|"
     r"(?<![\w:])(open|creat|system|socket|connect|bind|listen|remove|rename|chdir|kill|raise)\s*\(|"
     r"#\s*include\s*<(fstream|sys/socket\.h|dlfcn\.h|unistd\.h|sys/syscall\.h|netinet/\w+\.h|"
     r"arpa/inet\.h|spawn\.h|fcntl\.h)>|\"/(proc|dev|etc|tmp|home|root)/"),
    (Status.FORBIDDEN_TIMER, "tampers with timers",
     r"\b(clock_gettime|gettimeofday|rdtsc|__rdtsc|cudaEvent\w+|cudaProfilerStart|cudaProfilerStop|"
     r"nanosleep|usleep)\b|\b(clock|time|sleep)\s*\(|\bstd::chrono\b|"
     r"#\s*include\s*<(chrono|ctime|time\.h|sys/time\.h)>"),
    (Status.FORBIDDEN_CODE, "runs code at load",
     r"__attribute__\s*\(\(\s*(constructor|destructor)|\bLD_PRELOAD\b"),
]
_CPU_ONLY_RULES = [(Status.FORBIDDEN_CODE, "uses inline assembly", r"\b(asm|__asm__|__asm)\b")]

_PY_FORBIDDEN_NAMES = {"eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr",
                       "globals", "locals", "vars", "breakpoint", "input", "memoryview", "__builtins__"}
# attributes that lead from triton's or helion's modules to the interpreter, the system or other code
_PY_FORBIDDEN_ATTRS = {"os", "sys", "modules", "subprocess", "builtins", "environ", "runtime", "backends",
                       "compiler", "_C", "importlib", "ctypes", "torch", "shutil", "socket", "signal", "pathlib",
                       "io", "popen", "system", "getenv", "spawn", "exec_module", "loader", "f_globals",
                       "f_back", "gi_frame", "tb_frame"}
# metadata queries, and views (a launcher may hand a kernel a flat view of a tensor: no compute)
_PY_TENSOR_METHODS = {"stride", "numel", "size", "dim", "data_ptr", "is_contiguous", "element_size",
                      "ndimension", "as_strided", "view"}
_PY_CALLS = {"len", "range", "min", "max", "int", "float", "tuple", "list", "enumerate", "zip", "abs", "bool",
             "isinstance", "print"}  # and each backend's own (forge.backends: `calls`)


_C_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)


def _strip_c_comments(src: str) -> str:
    """Comments blanked (newlines kept, so line numbers hold); string and char literals left alone."""
    return _C_TOKENS.sub(lambda m: m[0] if m[0][0] in "\"'" else " " + "\n" * m[0].count("\n"), src)


Finding = tuple[Status, str]


def check_c(source: str, backend: str, entry: str = "forge_launch") -> list[Finding]:
    """Broken rules in a C/C++/CUDA source, each with its status and the offending text."""
    code = _strip_c_comments(source)
    rules = _C_RULES + (_CPU_ONLY_RULES if BACKENDS[backend].device == "cpu" else [])
    found: list[Finding] = []
    for status, rule, pattern in rules:
        m = re.search(pattern, code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            found.append((status, f"{rule}: `{m.group(0).strip()}` (line {line})"))
    if not re.search(rf"\b{re.escape(entry)}\s*\(", code):
        found.append((Status.BAD_FORMAT, f"defines no `{entry}` launcher (see forge_abi.h)"))
    return found


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _jit_functions(tree: ast.Module, kernels: tuple[str, ...]) -> set[ast.AST]:
    """The function definitions decorated as kernels (device code) by one of `kernels`."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if _dotted(target) in kernels:
                    out.add(node)
    return out


_IMPORT_STATUS = {"threading": Status.FORBIDDEN_CONCURRENCY, "multiprocessing": Status.FORBIDDEN_CONCURRENCY,
                  "concurrent": Status.FORBIDDEN_CONCURRENCY, "asyncio": Status.FORBIDDEN_CONCURRENCY,
                  "time": Status.FORBIDDEN_TIMER, "timeit": Status.FORBIDDEN_TIMER, "torch": Status.FORBIDDEN_TORCH}


_ODD_BREAKS = frozenset("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")  # str.splitlines' breaks that are not Python's


def check_python(source: str, entry: str = "launch", backend: str = TRITON.name) -> list[Finding]:
    """Broken rules in a Python (Triton, Helion) candidate: imports, builtins, and torch compute outside its
    kernels (and, for Helion, outside their device loops: forge.evaluate.tilechecks)."""
    b = BACKENDS[backend]
    odd = sorted({f"U+{ord(c):04X}" for c in source if c in _ODD_BREAKS})
    if odd:  # what inspect shows of a kernel and what Python runs could differ
        return [(Status.BAD_FORMAT, f"holds characters some readers split lines at and Python does not "
                 f"({', '.join(odd)})")]
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [(Status.BAD_FORMAT, f"does not parse: {e.msg} (line {e.lineno})")]
    found: list[Finding] = []
    late: list[Finding] = []  # `import torch`: reported after what the module does with it
    jit = _jit_functions(tree, b.kernels)
    inside_jit: set[ast.AST] = set()
    for f in jit:  # the bodies only: decorator arguments and defaults run in Python (at import, at launch)
        for stmt in f.body:
            inside_jit.update(ast.walk(stmt))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    allowed = _PY_CALLS | set(b.calls) | defined
    modules = {(a.asname or a.name).split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names
               if (a.asname or a.name).split(".")[0] != "torch"}
    for node in ast.walk(tree):
        where = f" (line {getattr(node, 'lineno', '?')})"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n not in b.modules:
                    status = _IMPORT_STATUS.get(n.split(".")[0], Status.FORBIDDEN_IO)
                    (late if n.split(".")[0] == "torch" else found).append(
                        (status, f"imports `{n}`: only {', '.join(b.modules)}{where}"))
        elif isinstance(node, ast.Name) and node.id == "open":
            found.append((Status.FORBIDDEN_IO, f"opens a file{where}"))
        elif isinstance(node, ast.Name) and node.id in _PY_FORBIDDEN_NAMES:
            found.append((Status.FORBIDDEN_CODE, f"uses `{node.id}`{where}"))
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            found.append((Status.FORBIDDEN_CODE, f"reaches into `{node.attr}`{where}"))
        elif isinstance(node, ast.Call) and node not in inside_jit:
            bad = _outside_call(node, allowed, modules, where)
            if bad is not None:
                found.append(bad)
    found += _module_shape(tree, b) + _tensor_math_outside_jit(tree, jit) + late
    if "torch" in b.modules:  # kernels of PyTorch ops on tiles: where torch may appear in them
        found += check_tile_kernels(tree, jit, b.kernels)
    if entry not in defined:
        found.append((Status.BAD_FORMAT, f"defines no `{entry}(inputs, outputs)` function"))
    if not jit:
        found.append((Status.BAD_FORMAT, f"defines no @{b.kernels[0]} kernel"))
    return found


def _outside_call(node: ast.Call, allowed: set[str], modules: set[str], where: str) -> Finding | None:
    """A call outside the kernels' bodies: None when allowed (or reported where its name is visited), else why
    not (another stream, a module's way out, PyTorch compute, any other code)."""
    name = _dotted(node.func)
    if isinstance(node.func, ast.Subscript):  # kernel[grid](...)
        return None
    if name in allowed or name in _PY_FORBIDDEN_NAMES or name == "open":
        return None  # allowed, or reported where the name itself is visited
    if isinstance(node.func, ast.Attribute) and node.func.attr in _PY_TENSOR_METHODS:
        return None
    if name.startswith("torch.cuda.") and "tream" in name:
        return (Status.FORBIDDEN_CONCURRENCY, f"uses another stream: `{name}(...)`{where}")
    if name.split(".")[0] in modules:  # triton.runtime...os.system(...): not PyTorch, a way out
        return (Status.FORBIDDEN_CODE, f"calls `{name}(...)` outside a kernel{where}")
    if name.startswith("torch.") or isinstance(node.func, ast.Attribute):
        return (Status.FORBIDDEN_TORCH, f"calls `{name or ast.unparse(node.func)}(...)` outside a kernel "
                f"(PyTorch compute is not allowed){where}")
    return (Status.FORBIDDEN_CODE, f"calls `{name or ast.unparse(node.func)}(...)` outside a kernel{where}")


def _module_shape(tree: ast.Module, b: Backend) -> list[Finding]:
    """What a Python module may hold: imports, a docstring, names bound to literal constants, and function
    definitions decorated by its backend's kernel decorators only (nothing else runs at import); and nowhere an
    assignment to an attribute (`torch.equal = ...`, `math.exp = ...`), a deletion of one, or a `global`."""
    found: list[Finding] = []
    for node in tree.body:
        where = f" (line {node.lineno})"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets) and \
                _literal(node.value):
            continue
        if isinstance(node, ast.FunctionDef):
            bad = [d for d in node.decorator_list if _dotted(d.func if isinstance(d, ast.Call) else d)
                   not in b.kernels]
            if bad:
                found.append((Status.FORBIDDEN_CODE, f"decorates `{node.name}` with `{ast.unparse(bad[0])}`: "
                              f"only {', '.join(b.kernels)}{where}"))
            continue
        found.append((Status.FORBIDDEN_CODE, f"runs code at import: a top-level {type(node).__name__} "
                      f"statement (only imports, constants and function definitions){where}"))
    for node in ast.walk(tree):
        where = f" (line {getattr(node, 'lineno', '?')})"
        # every binding position (=, augmented, for, with ... as, comprehensions, del) marks its target Store
        # or Del: an attribute there patches a module or object; a subscript of an attribute (`sys.modules[..]
        # = `, `os.environ[..] = `) too
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append((Status.FORBIDDEN_CODE, f"assigns to the attribute `{ast.unparse(node)}`{where}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                isinstance(node.value, ast.Attribute):
            found.append((Status.FORBIDDEN_CODE, f"assigns into `{ast.unparse(node.value)}`{where}"))
        elif isinstance(node, ast.Attribute) and node.attr in _PY_FORBIDDEN_ATTRS:
            found.append((Status.FORBIDDEN_CODE, f"reaches `.{node.attr}` (`{ast.unparse(node)}`): a way out of "
                          f"triton to the interpreter or the system{where}"))
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append((Status.FORBIDDEN_CODE, f"declares `{type(node).__name__.lower()}` names{where}"))
    return found


def _literal(node: ast.AST) -> bool:
    """A literal constant: a number, string, bool or None, or a tuple of them (negatives included)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _literal(node.operand)
    return isinstance(node, ast.Tuple) and all(_literal(e) for e in node.elts)


def _tensor_math_outside_jit(tree: ast.Module, jit: set[ast.AST]) -> list[Finding]:
    """PyTorch compute written with operators in a launcher: `y[...] = x * 2`, `x / (1 + ...)`.

    Tensors are the launcher's parameters and any name bound to a subscript of a tensor; arithmetic on
    them outside @triton.jit, or assignment into a subscript of them, is PyTorch compute.
    """
    found: list[Finding] = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn in jit:
            continue
        tensors = {a.arg for a in fn.args.args}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign):
                continue
            pairs = [(t, node.value) for t in node.targets]
            for t in node.targets:
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(t.elts, node.value.elts, strict=False))
            for target, value in pairs:
                if isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                        _dotted(value.value) in tensors:
                    tensors.add(target.id)
        for node in ast.walk(fn):
            where = f" (line {getattr(node, 'lineno', '?')})"
            names: list[ast.AST] = []
            if isinstance(node, ast.BinOp):
                names = [node.left, node.right]
            elif isinstance(node, ast.UnaryOp):
                names = [node.operand]
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.value for t in targets if isinstance(t, ast.Subscript)]
            for n in names:
                base = n.value if isinstance(n, ast.Subscript) else n
                if _dotted(base) in tensors:
                    found.append((Status.FORBIDDEN_TORCH, f"computes on tensor `{ast.unparse(n)}` in Python "
                                  f"outside a @triton.jit kernel{where}"))
                    break
    return found


def check(candidate: Candidate) -> list[Finding]:
    """Every rule the candidate breaks, as (status, message); empty when it may be built."""
    if not BACKENDS[candidate.backend].native:
        return check_python(candidate.source, candidate.entry, candidate.backend)
    return check_c(candidate.source, candidate.backend, candidate.entry)
