"""Static checks of Helion modules (forge.evaluate.checks with forge.evaluate.tilechecks): a module is imports,
constants and kernels whose host part is only loops; torch lives in the device loops and nowhere else; nothing is
patched. Each hostile module is rejected with its status; the prompts' example and a row kernel pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge.evaluate.checks import check, check_python
from forge.kernel import Candidate, Status

EXAMPLE = (Path(__file__).resolve().parents[1] / "prompts" / "examples" / "helion.py").read_text()

ROWS = '''"""softmax rows, two passes."""
import helion
import helion.language as hl
import torch

ROWS_PER_PROGRAM = 2


@helion.kernel(config=helion.Config(block_sizes=[2, 64, 64], num_warps=4, num_stages=1), static_shapes=True,
               index_dtype=torch.int64)
def forge_rows(in0: torch.Tensor, out0: torch.Tensor) -> None:
    """A row per tile row."""
    for tile_r in hl.tile(7):
        r = tile_r.index[:, None]
        m = hl.full([tile_r, 1], float("-inf"), torch.float32)
        s = hl.zeros([tile_r, 1], torch.float32)
        for tile_j in hl.tile(300):
            x = in0[r * 300 + tile_j.index[None, :]].to(torch.float32)
            mn = torch.maximum(m, torch.amax(x, dim=1, keepdim=True))
            s = s * torch.exp(m - mn) + torch.sum(torch.exp(x - mn), dim=1, keepdim=True)
            m = mn
        for tile_j in hl.tile(300):
            x = in0[r * 300 + tile_j.index[None, :]].to(torch.float32)
            out0[r * 300 + tile_j.index[None, :]] = (torch.exp(x - m) / s).to(torch.bfloat16)


def launch(inputs, outputs):
    if len(inputs) != 1 or inputs[0].stride(0) != 300:
        return 2
    forge_rows(inputs[0].as_strided((2100,), (1,)), outputs[0].view(-1))
    return 0
'''

KERNEL_LINE = "        y[tile] = torch.relu(x[tile])\n"
HOST_LINE = "    for tile in hl.tile(x.numel()):  # Helion masks the tail: the size need not divide\n"
LAUNCH_LINE = "    relu_kernel(inputs[0].view(-1), outputs[0].view(-1))\n"


def _with(old: str, new: str) -> str:
    assert old in EXAMPLE
    return EXAMPLE.replace(old, new, 1)


HOSTILE = [
    # torch on the host: in the kernel's host part, in a loop's range, in the launcher, at import
    ("host-part-softmax", _with(HOST_LINE, "    y.copy_(torch.softmax(x, -1))\n" + HOST_LINE), Status.FORBIDDEN_TORCH),
    ("host-part-alloc", _with(HOST_LINE, "    tmp = torch.empty_like(x)\n" + HOST_LINE), Status.FORBIDDEN_TORCH),
    ("range-computes", _with("hl.tile(x.numel())", "hl.tile(torch.relu(x).numel())"), Status.FORBIDDEN_TORCH),
    ("launcher-computes", _with(LAUNCH_LINE, "    outputs[0].copy_(torch.relu(inputs[0]))\n"),
     Status.FORBIDDEN_TORCH),
    ("launcher-method", _with(LAUNCH_LINE, "    outputs[0].copy_(inputs[0].relu())\n"), Status.FORBIDDEN_TORCH),
    ("import-time-call", _with("\n\n@helion", "\ntorch.manual_seed(0)\n\n@helion"), Status.FORBIDDEN_CODE),
    # patching anything, anywhere
    ("patch-torch", _with("\n\n@helion", "\ntorch.relu = torch.abs\n\n@helion"), Status.FORBIDDEN_CODE),
    ("patch-in-launch", _with(LAUNCH_LINE, "    torch.equal = max\n" + LAUNCH_LINE), Status.FORBIDDEN_CODE),
    ("patch-in-kernel", _with(KERNEL_LINE, "        torch.relu = torch.abs\n" + KERNEL_LINE), Status.FORBIDDEN_CODE),
    ("patch-helion", _with(LAUNCH_LINE, "    helion.Config = dict\n" + LAUNCH_LINE), Status.FORBIDDEN_CODE),
    ("global", _with(LAUNCH_LINE, "    global K\n" + LAUNCH_LINE), Status.FORBIDDEN_CODE),
    # the device loops: torch ops one level deep, tile ops of helion.language, no module aliases
    ("aten-in-kernel", _with("torch.relu(x[tile])", "torch.ops.aten.relu(x[tile])"), Status.FORBIDDEN_CODE),
    ("cuda-in-kernel", _with(KERNEL_LINE, "        torch.cuda.synchronize()\n" + KERNEL_LINE), Status.FORBIDDEN_CODE),
    ("private-torch", _with("torch.relu(x[tile])", "torch._C._nn.gelu(x[tile])"), Status.FORBIDDEN_CODE),
    ("save-in-kernel", _with(KERNEL_LINE, "        torch.save(x, 'x.pt')\n" + KERNEL_LINE), Status.FORBIDDEN_CODE),
    ("alias-torch", _with(KERNEL_LINE, "        t = torch\n" + KERNEL_LINE), Status.FORBIDDEN_CODE),
    ("device-print", _with(KERNEL_LINE, "        hl.device_print('x', x[tile])\n" + KERNEL_LINE),
     Status.FORBIDDEN_CODE),
    ("breakpoint", _with(KERNEL_LINE, "        hl.breakpoint()\n" + KERNEL_LINE), Status.FORBIDDEN_CODE),
    ("helper-call", _with("torch.relu(x[tile])", "helper(x[tile])"), Status.FORBIDDEN_CODE),
    # settings that change what runs: eager reference mode, logs written to files
    ("ref-mode", _with("static_shapes=True)", "static_shapes=True, ref_mode=helion.RefMode.EAGER)"),
     Status.FORBIDDEN_CODE),
    ("autotune-log", _with("static_shapes=True)", "static_shapes=True, autotune_log='/tmp/x')"),
     Status.FORBIDDEN_CODE),
    # no autotuning in the worker: one config, in the source
    ("no-config", _with("config=helion.Config(block_sizes=[1024], num_warps=4, num_stages=1), ", ""),
     Status.FORBIDDEN_CODE),
    ("bare-decorator", _with("@helion.kernel(config=helion.Config(block_sizes=[1024], num_warps=4, num_stages=1), "
                             "static_shapes=True)", "@helion.kernel"), Status.FORBIDDEN_CODE),
    ("configs", _with("config=helion.Config(block_sizes=[1024], num_warps=4, num_stages=1)",
                      "configs=[helion.Config(block_sizes=[1024], num_warps=4, num_stages=1)]"), Status.FORBIDDEN_CODE),
    ("autotune-effort", _with("static_shapes=True)", "static_shapes=True, autotune_effort='quick')"),
     Status.FORBIDDEN_CODE),
    ("other-decorator", _with("@helion.kernel(", "@torch.compile\n@helion.kernel("), Status.FORBIDDEN_CODE),
    ("import-os", _with("import torch\n", "import torch\nimport os\n"), Status.FORBIDDEN_IO),
    ("import-triton", _with("import torch\n", "import torch\nimport triton\n"), Status.FORBIDDEN_IO),
]


@pytest.mark.parametrize(("source", "status"), [pytest.param(s, st, id=name) for name, s, st in HOSTILE])
def test_a_hostile_helion_module_is_rejected(source: str, status: Status) -> None:
    found = check(Candidate("helion", source))
    assert status in [s for s, _ in found], found


def test_good_helion_modules_pass() -> None:
    assert check(Candidate("helion", EXAMPLE)) == []
    assert check(Candidate("helion", ROWS)) == []


def test_the_rules_are_the_backends_own() -> None:
    """A Triton module may not import torch, nor a Helion one triton; a Helion module needs a helion kernel."""
    assert Status.FORBIDDEN_TORCH in [s for s, _ in check(Candidate("triton", EXAMPLE))]
    no_kernel = EXAMPLE.replace("@helion.kernel(config=helion.Config(block_sizes=[1024], num_warps=4, num_stages=1), "
                                "static_shapes=True)\n", "")
    assert "defines no @helion.kernel kernel" in [m for _, m in check_python(no_kernel, backend="helion")]
