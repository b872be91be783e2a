"""Prompts from the templates in prompts/llm/ (string.Template, `$name`), and the facts they show.

A prompt has two renderings: `text` (sent) and `key` (hashed for the response cache), where every
measured number (times, bandwidth, errors) is masked, so a rerun whose timings differ by noise still
hits the cache when the kernels and their outcomes are the same.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from forge.backends import BACKENDS
from forge.kernel import TaskSpec

PROMPTS = Path(__file__).resolve().parents[3] / "prompts"  # the checkout's prompts/ (forge/policy/llm/)
LANG = {name: b.prompt_lang for name, b in BACKENDS.items()}
_M0, _M1 = "\x01", "\x02"  # around a measured value while rendering
_MEASURED = re.compile(f"{_M0}[^{_M1}]*{_M1}")
_NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[+-]?\d+)?|(?<![\w.])\d+e[+-]?\d+", re.I)


@dataclass(frozen=True)
class Prompt:
    """A rendered message: the text sent, and the same text with measurements masked (the cache key)."""

    text: str
    key: str

    @classmethod
    def of(cls, marked: str) -> Prompt:
        """Split a rendering with measured markers into text and key."""
        return cls(marked.replace(_M0, "").replace(_M1, ""), _MEASURED.sub("#", marked))


def measured(value: object) -> str:
    """A value that varies run to run (a time, a bandwidth): shown, but not part of the cache key."""
    return f"{_M0}{value}{_M1}"


def measured_numbers(text: str) -> str:
    """Every decimal number in a message (errors, times) marked as measured."""
    return _NUMBER.sub(lambda m: measured(m[0]), text)


@cache
def template(name: str) -> Template:
    """prompts/llm/NAME.md, or prompts/NAME.md for the ABI texts."""
    path = PROMPTS / "llm" / f"{name}.md"
    return Template((path if path.exists() else PROMPTS / f"{name}.md").read_text())


def render(name: str, **values: object) -> Prompt:
    """A template filled in; a missing value is a KeyError (a bug in forge, not in the model)."""
    return Prompt.of(template(name).substitute({k: str(v) for k, v in values.items()}).strip() + "\n")


def system_prompt(backend: str) -> Prompt:
    """The kernel ABI of the backend, the rules, what is forbidden and how it is caught."""
    return render("system", backend=backend, lang=LANG[backend], abi=template(f"abi-{backend}").template.strip())


def tensor_lines(metas: tuple, prefix: str) -> str:
    """One line per tensor: index, dtype, shape, strides."""
    return "\n".join(f"- `{prefix}[{i}]`: {m.dtype}, shape {list(m.shape)}, strides {list(m.stride)}"
                     for i, m in enumerate(metas)) or "- (none)"


def task_values(spec: TaskSpec, backend: str) -> dict[str, object]:
    """What every prompt about a task can show of it."""
    return {"key": spec.key, "source": spec.source.strip(), "inputs": tensor_lines(spec.inputs, "in"),
            "outputs": tensor_lines(spec.outputs, "out"), "floor_bytes": spec.floor_bytes,
            "backend": backend, "lang": LANG[backend]}


def _cpu_facts() -> str:
    model, caches = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        base = Path("/sys/devices/system/cpu/cpu0/cache")
        for idx in sorted(base.glob("index*")):
            level, kind = (idx / "level").read_text().strip(), (idx / "type").read_text().strip()
            if kind != "Instruction":
                caches.append(f"L{level} {(idx / 'size').read_text().strip()}")
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = ", ".join(f for f in ("avx2", "avx512f", "fma", "neon", "sve") if re.search(rf"\b{f}\b", text))
    except OSError:
        pass
    return (f"CPU: {model or 'unknown model'}, {os.cpu_count()} cores (OpenMP threads)"
            + (f"; caches per core: {', '.join(caches)}" if caches else "")
            + (f"; SIMD: {flags}" if flags else ""))


def _cuda_facts(device: str) -> str:
    import torch

    p = torch.cuda.get_device_properties(device)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or getattr(p, "shared_memory_per_multiprocessor", 0)
    return (f"GPU: {p.name} (sm_{p.major}{p.minor}), {p.multi_processor_count} SMs, L2 "
            f"{getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, shared memory up to {smem / 1024:.0f} KiB per "
            f"block, {p.total_memory / 2**30:.0f} GiB memory")


@cache
def device_facts(device: str) -> str:
    """SMs, caches, shared memory (CUDA) or cores and caches (CPU), as one line."""
    return _cuda_facts(device) if device.startswith("cuda") else _cpu_facts()


def bandwidth_line(floor_bytes: int, floor_us: float | None) -> str:
    """The measured bandwidth behind the roofline floor, when known."""
    if not floor_us or not floor_bytes:
        return ""
    return f"; measured memory bandwidth {measured(f'{floor_bytes / floor_us / 1e3:.0f}')} GB/s"
