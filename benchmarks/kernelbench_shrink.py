"""CPU-sized copies of KernelBench problem files: module-level sizes halved until the inputs are small.

KernelBench's shapes are sized for a GPU (a [16384, 16384] input is a gigabyte). This writes a copy of each
file with its module-level integer constants that are sizes (not kernel sizes, strides, paddings,
dilations, groups, reduction dims, epsilons, ...: `_KEEP`) halved, all together, until the largest input
and the largest output hold at most --elements elements (counted on the meta device: nothing is
allocated). Sizes written as tuples or powers are not shrunk; a file whose sizes then no longer fit
together is skipped, with the reason. Constants of 8 or less are left alone. The
copies are for local runs only; KernelBench's files are not part of forge.

    python benchmarks/kernelbench_shrink.py KernelBench/level1/*.py --out /tmp/kb/level1 --elements 1048576
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import types
from pathlib import Path

import torch
import torch.utils._pytree as pytree

_KEEP = re.compile(r"kernel|stride|pad|dilation|group|^eps|_eps|epsilon|axis|margin|alpha|beta|scale|^p$|seed|"
                   r"negative|value|bias|reduce", re.I)


def _int_of(node: ast.expr) -> int | None:
    """The value of an integer literal or of arithmetic on integer literals (`16384 * 4`), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.FloorDiv)):
        a, b = _int_of(node.left), _int_of(node.right)
        if a is not None and b is not None:
            return {ast.Mult: a * b, ast.Add: a + b, ast.Sub: a - b}.get(type(node.op), a // b if b else None)
    return None


def size_constants(tree: ast.Module) -> list[ast.Assign]:
    """Module-level `NAME = <int > 8>` assignments whose names look like sizes (values folded to constants)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and (value := _int_of(node.value)) is not None and value > 8 and not _KEEP.search(node.targets[0].id):
            node.value = ast.Constant(value)
            out.append(node)
    return out


def largest_input(source: str, path: Path) -> int:
    """Elements of the largest input (get_inputs()) or output of the model, run on the meta device; sizes
    that no longer fit together (a shape kept in a tuple, say) raise."""
    module = types.ModuleType(path.stem)
    with torch.device("meta"), torch.no_grad():
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - a benchmark file of the user's
        inputs = module.get_inputs()
        outputs = module.Model(*module.get_init_inputs())(*inputs)
    tensors = [x for x in (*inputs, *pytree.tree_leaves(outputs)) if isinstance(x, torch.Tensor)]
    return max((x.numel() for x in tensors), default=0)


def shrink(path: Path, elements: int) -> str | None:
    """The shrunk source of `path`, or None when it cannot be shrunk far enough."""
    source = path.read_text()
    for _ in range(40):
        try:
            if largest_input(source, path) <= elements:
                return source
        except Exception as e:  # noqa: BLE001 - a file that does not build on meta: skipped, said why
            print(f"{path.name}: skipped ({type(e).__name__}: {str(e)[:80]})", file=sys.stderr)
            return None
        tree = ast.parse(source)
        consts = size_constants(tree)
        if not consts:
            break
        for node in consts:
            node.value.value = max(8, node.value.value // 2)
        source = ast.unparse(tree) + "\n"
    print(f"{path.name}: skipped (inputs stay above {elements} elements)", file=sys.stderr)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--elements", type=int, default=1 << 20, help="largest input, in elements")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.files:
        source = shrink(path, args.elements)
        if source is not None:
            (args.out / path.name).write_text(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
