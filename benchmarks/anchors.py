"""The seven anchor tasks of ../shared/ANCHORS.md (H200): search each with the recipe policy and compare.

For each anchor region (same shapes and dtypes as ANCHORS.md) the script captures the region as forge
would, runs the MCTS with the offline recipe policy on the GPU (at most 64 candidates and 5 minutes per
task), and times, in this process and with forge's own method (L2 flushed, CUDA events, medians):
eager, torch.compile (mode max-autotune-no-cudagraphs) and the floor (bytes over the measured copy rate).
The best kernel's time comes from the worker, interleaved with eager there.

    python benchmarks/anchors.py [--only NAME ...] [--candidates 64] [--minutes 5] [--json PATH]

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

bf16 = torch.bfloat16


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x.float(), -1).to(bf16)


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int = 2304) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim).to(bf16) * 0.1)

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class SwiGLU(nn.Module):
    def forward(self, g, u):
        return nn.functional.silu(g) * u


class GroupNormSiLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(32, 512, eps=1e-6)

    def forward(self, x):
        return nn.functional.silu(self.norm(x))


class GeluTanh(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x, approximate="tanh")


class LayerNormModulate(nn.Module):
    def forward(self, x, scale, shift):
        h = nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
        return h * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class BatchNormReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(256)

    def forward(self, x):
        return torch.relu(self.bn(x))


@dataclass(frozen=True)
class Anchor:
    name: str
    make: Callable[[], nn.Module]
    shapes: tuple[tuple[tuple[int, ...], torch.dtype], ...]


ANCHORS = (
    Anchor("gemma-softmax", Softmax, (((1, 8, 2048, 2048), bf16),)),
    Anchor("gemma-rmsnorm", GemmaRMSNorm, (((2048, 2304), bf16),)),
    Anchor("qwen-swiglu", SwiGLU, (((2048, 12288), bf16), ((2048, 12288), bf16))),
    Anchor("vae-groupnorm-silu", GroupNormSiLU, (((1, 512, 128, 128), bf16),)),
    Anchor("sd35-gelu-tanh", GeluTanh, (((1, 4429, 6144), bf16),)),
    Anchor("sd35-layernorm-modulate", LayerNormModulate, (((1, 4096, 1536), bf16), ((1, 1536), bf16),
                                                          ((1, 1536), bf16))),
    Anchor("resnet-bn-relu-fp32", BatchNormReLU, (((32, 256, 56, 56), torch.float32),)),
)


def module(a: Anchor, device: str) -> nn.Module:
    m = a.make().eval()
    if isinstance(m, GroupNormSiLU):
        with torch.no_grad():
            m.norm.weight.normal_()
            m.norm.bias.normal_()
        m = m.to(bf16)
    if isinstance(m, BatchNormReLU):
        with torch.no_grad():
            m.bn.running_mean.normal_()
            m.bn.running_var.uniform_(0.5, 2.0)
    return m.to(device)


def tasks_of(a: Anchor, device: str):
    """The anchor region's tasks as forge cuts them (captured on meta: shapes only)."""
    from forge.capture.export import capture
    from forge.tasks.cut import build_tasks

    m = module(a, "meta")
    inputs = [torch.empty(s, dtype=d, device="meta") for s, d in a.shapes]
    return build_tasks(capture(m, inputs).graph_module.graph)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="anchor names")
    p.add_argument("--candidates", type=int, default=64)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--json", help="write the rows as JSON")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()

    from forge.bench import Clock, measure_bandwidth
    from forge.evaluate.evaluator import Evaluator
    from forge.kernel import TaskSpec
    from forge.policy.recipes.policy import RecipePolicy
    from forge.search.driver import Budget, search
    from forge.store import Store
    from forge.store.recorder import StoreRecorder

    device = args.device
    clock = Clock(device)
    bandwidth = measure_bandwidth(device)
    rows = []
    store = Store("sqlite:///" + str(Path(args.json or "anchors").with_suffix(".db")))
    run = store.create_run("anchors", device=device, policy="recipes")
    policy = RecipePolicy(device)
    with Evaluator(device) as ev:
        for a in ANCHORS:
            if args.only and a.name not in args.only:
                continue
            tasks = tasks_of(a, device)
            if len(tasks) != 1:
                print(f"{a.name}: {len(tasks)} tasks ({[t.key for t in tasks]})", file=sys.stderr)
            task = max(tasks, key=lambda t: t.bytes or 0)
            spec = TaskSpec.of(task)
            m = module(a, device)
            inputs = [torch.randn(s, device=device).to(d) for s, d in a.shapes]
            compiled = torch.compile(m, mode="max-autotune-no-cudagraphs")
            with torch.no_grad():
                compiled(*inputs)
                med = {}
                for label, fn in (("eager", m), ("compile", compiled)):
                    samples = sorted(clock.time_us(lambda fn=fn, xs=inputs: fn(*xs)) for _ in range(100))
                    med[label] = samples[len(samples) // 2]
            start = time.monotonic()
            budget = Budget(candidates=args.candidates, per_task=args.candidates, min_per_task=8,
                            seconds=60 * args.minutes, patience=24, parallel=16, min_share=0.0)
            (out,) = search([dataclasses.replace(task, share=1.0)], policy, ev, StoreRecorder(store, run.id), budget)
            minutes = (time.monotonic() - start) / 60
            floor = spec.floor_bytes / bandwidth * 1e6
            best = out.best_us
            goal = max(1.25 * floor, floor + 3.0)
            rows.append({"anchor": a.name, "task": task.key, "eager_us": med["eager"], "compile_us": med["compile"],
                         "forge_us": best, "worker_eager_us": out.eager_us, "floor_us": floor, "goal_us": goal,
                         "candidates": out.candidates, "minutes": minutes, "stop": out.stop_reason,
                         "met": bool(best and best <= goal and best < med["compile"])})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\ncopy rate {bandwidth / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}; torch {torch.__version__}\n")
    print("| anchor | eager us | torch.compile us | forge us | floor us | goal us | met | candidates | minutes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = f"{r['forge_us']:.1f}" if r["forge_us"] else "-"
        print(f"| {r['anchor']} | {r['eager_us']:.1f} | {r['compile_us']:.1f} | {f} | {r['floor_us']:.1f} | "
              f"{r['goal_us']:.1f} | {'yes' if r['met'] else 'no'} | {r['candidates']} | {r['minutes']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
