"""The text of an exported kernel repository's generated files: the package's __init__.py and layers.py, the
tests, build.toml and the card (README.md). Pure functions of the export's plan (forge.export.hf_kernels)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import jinja2

from forge.backends import BACKENDS
from forge.export.align import LayerSpec
from forge.tolerance import tolerance

# The card is Markdown, not HTML: nothing is escaped. keep_trailing_newline: the file ends with its newline.
_CARD = jinja2.Environment(loader=jinja2.PackageLoader("forge.export", "templates"), autoescape=False,
                           undefined=jinja2.StrictUndefined, keep_trailing_newline=True).get_template("card.md.j2")


@dataclass(frozen=True)
class Exported:
    """One kernel as the export names and describes it."""

    name: str  # the op's and the function's name (the task key, with underscores)
    key: str
    backend: str
    family: str
    inputs: tuple[str, ...]  # short metadata, e.g. "f32[4, 256, 512]"
    dtype: str  # of the first output: the tests' tolerance
    eager_us: float | None
    kernel_us: float | None


def init_py(pyname: str, kernels: list[Exported], layer_names: list[str]) -> str:
    """The package's __init__.py: loads the runtime, exposes each kernel as a function and `ops`."""
    names = list(dict.fromkeys(k.name for k in kernels))  # a kernel with two forms is one function
    lines = [f'"""{pyname}: kernels exported by forge; each is a torch op (`ops.<name>`) and a guarded function."""',
             "", "from pathlib import Path", "", "import torch", "", "from . import _runtime", "",
             "namespace, _KERNELS = _runtime.load(Path(__file__).parent)",
             "ops = getattr(torch.ops, namespace)", ""]
    lines += [f"{n} = _KERNELS[{n!r}]" for n in names]
    lines += ["", "from . import layers  # noqa: E402 - the layers call the kernels above", "",
              f"__all__ = {['ops', 'layers', *names]!r}", f"LAYERS = {layer_names!r}", ""]
    return "\n".join(lines)


def _safe(text: str) -> str:
    """Text for inside a generated docstring: no quotes or backslashes that could end it."""
    return re.sub(r'["\\]', "_", text)


def _literal(v: object) -> str:
    """A Python literal of a module setting; inf and nan as float("inf") / float("nan") (their repr is no literal)."""
    if isinstance(v, tuple):
        return "(" + "".join(f"{_literal(x)}, " for x in v) + ")"
    if isinstance(v, float) and not math.isfinite(v):
        return f'float("{v}")'
    return repr(v)


def _layer(spec: LayerSpec, name: str) -> str:
    numel = 1
    for d in spec.arg_shape:
        numel *= d
    args = ", ".join(f"{spec.arg_name}.reshape({spec.arg_shape!r})" if not i else f"self.{i}" for i in spec.inputs)
    config = ", ".join(f"{k!r}: {_literal(v)}" for k, v in spec.config)
    return f'''

_{spec.layer_name}_CONFIG = {{{config}}}


class {spec.layer_name}(nn.Module):
    """{spec.module_class} ({_safe(spec.module_path)} in the exported model) through kernel `{name}`; the module's own
    forward where its attributes differ from the exported one's or the kernel's guard does not hold."""

    can_torch_compile = True
    has_backward = False

    def forward(self, {spec.arg_name}):
        k = _KERNELS[{name!r}]
        if {spec.arg_name}.numel() == {numel} and all(getattr(self, a, None) == v
                                         for a, v in _{spec.layer_name}_CONFIG.items()):
            args = ({args},)
            if k.applies(args):
                return k.op(*args)[{spec.out_index}].reshape({spec.out_shape!r})
        return type(self).forward(self, {spec.arg_name})
'''


def layers_py(specs: dict[str, tuple[LayerSpec, str]]) -> str:
    """layers.py: one stateless layer per module-aligned kernel (kernels.kernelize checks they add no member)."""
    head = ('"""Layers for kernels.kernelize: each replaces the forward of one module class of the exported model."""'
            "\n\nfrom torch import nn\n\nfrom . import _KERNELS\n")
    body = "".join(_layer(spec, name) for spec, name in specs.values())
    return head + body + f"\n\n__all__ = {sorted(specs)!r}\n"


def test_py(pyname: str, kernels: list[Exported]) -> str:
    """tests/test_<pyname>.py: each kernel, loaded with the kernels package, against its reference."""
    tols = {k.name: tolerance(k.dtype).kernel for k in kernels}
    forms = sorted({(k.name, BACKENDS[k.backend].device) for k in kernels})
    return f'''"""Each kernel of {pyname} against its reference region (forge's kernel tolerance per dtype), on fresh
random inputs of the shapes it was verified for. Run from the repository: python -m pytest tests"""

from pathlib import Path

import pytest
import torch
from kernels import get_local_kernel

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = {tols!r}
FORMS = {forms!r}  # (kernel, device type): a kernel may have a CPU form and a Triton or Helion one for CUDA


@pytest.fixture(scope="module")
def kernel():
    return get_local_kernel(REPO)


def _inputs(k, seed, device):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for m in k.inputs:
        if m.dtype.is_floating_point:
            t = torch.randn(m.shape, generator=gen, dtype=torch.float32).to(m.dtype)
        elif m.dtype is torch.bool:
            t = torch.rand(m.shape, generator=gen) > 0.5
        else:
            t = torch.randint(0, 8, m.shape, generator=gen, dtype=m.dtype)
        out.append(torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=device).copy_(t))
    return out


def _error(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).abs() / (ref.abs() + ref.abs().mean())).max().item() if ref.numel() else 0.0


@pytest.mark.parametrize("name,device", FORMS)
def test_kernel_matches_its_reference(kernel, name, device):
    k = getattr(kernel, name)
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    if device not in k.forms:
        pytest.skip("this form does not run here (machine code of another machine, or no triton/helion)")
    for seed in (0, 1):
        args = _inputs(k, seed, device)
        assert k.applies(tuple(args))
        with torch.no_grad():
            outs, refs = k.op(*args), k.reference(*args)
        assert len(outs) == len(refs)
        for o, r in zip(outs, refs):
            assert o.shape == r.shape and o.dtype == r.dtype
            assert _error(o, r) <= TOLERANCE[name], (name, seed, _error(o, r))
'''


def build_toml(name: str, kernels: list[Exported], backends: list[str]) -> str:
    """kernel-builder's build.toml: the kernels' sources by backend (forge builds them: see the card)."""
    lines = ["[general]", f'name = "{name}"', "version = 1", 'license = "apache-2.0"',
             f"backends = {backends!r}".replace("'", '"'), "", "[torch]",
             f'src = ["torch-ext/{name.replace("-", "_")}/__init__.py"]', ""]
    names = {k.name: 0 for k in kernels}
    for k in kernels:
        b = BACKENDS[k.backend]
        names[k.name] += 1
        section = k.name if names[k.name] == 1 else f"{k.name}_{k.backend}"  # a second form of one kernel
        lines += [f"[kernel.{section}]", f'backend = "{b.device}"', 'depends = ["torch"]',
                  f'src = ["kernels/{k.name}{b.suffix}"]', ""]
    return "\n".join(lines)


def _us(v: float | None) -> str:
    return f"{v:.1f}" if v else "-"


def beyond_kernels(variant: dict) -> str:
    """What of forge's result (forge.runtime.variants.Variant.to_json) the exported kernels do not carry: its
    whole-graph rewrites and runtime (CUDA graph replay, Inductor) are forge.load's, and kernels it leaves out
    are here all the same; "" where its speedup is the kernels' alone."""
    rewrites = [f"`{r}`" for r in variant.get("rewrites") or ()]
    runtime = str(variant.get("runtime") or "graph")
    without = [f"`{k}`" for k in variant.get("without") or ()]
    parts = []
    if rewrites:
        parts.append(f"the graph rewrite{'s' if len(rewrites) > 1 else ''} {', '.join(rewrites)}")
    if runtime != "graph":
        parts.append(f"the runtime `{runtime}`")
    said = []
    if parts:
        said.append(f"forge's kernels with {', and with '.join(parts)}. This repository carries the kernels alone; "
                    "the rest of that speedup is `forge.load`'s")
    if without:
        said.append(f"forge's result leaves out {', '.join(without)}, exported all the same")
    return f", as `{variant.get('name', '?')}`: {'. '.join(said)}" if said else ""


def card(name: str, info: dict, kernels: list[Exported], specs: dict[str, tuple[LayerSpec, str]],
         variants: list[str]) -> str:
    """README.md: where the kernels were tuned, what they take, how fast they were there, how to load them."""
    pyname = name.replace("-", "_")
    rows = "\n".join(f"| `{k.name}` | {k.family} | {k.backend} | {', '.join(k.inputs)} | {_us(k.eager_us)} | "
                     f"{_us(k.kernel_us)} | {(k.eager_us / k.kernel_us) if k.eager_us and k.kernel_us else 0:.2f}x |"
                     for k in kernels)
    layers = "\n".join(f"| `{s.layer_name}` | `{s.module_class}` | `{s.module_path}` | `{n}` |"
                       for s, n in specs.values()) or "| (none) | | | |"
    device = info.get("device", "cpu").split(":")[0]
    mapping = ", ".join(f'"{s.layer_name}": {{"{device}": LocalLayerRepository(repo, layer_name="{s.layer_name}")}}'
                        for s, _ in specs.values())
    e2e = (f"{info['eager_ms']:.3f} ms eager, {info['forge_ms']:.3f} ms with forge "
           f"({info['eager_ms'] / info['forge_ms']:.2f}x){beyond_kernels(info.get('variant') or {})}"
           if info.get("eager_ms") and info.get("forge_ms") else "-")
    return _CARD.render(
        name=name, pyname=pyname, info=info, rows=rows, layers=layers, mapping=mapping, e2e=e2e, device=device,
        first=kernels[0].name if kernels else "name", variants=", ".join(f"`{v}`" for v in variants))
