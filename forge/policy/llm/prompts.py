"""Prompts from the Jinja2 templates in prompts/llm/ (one per request kind), and the task facts they show.

A prompt has two renderings: `text` (sent) and `key` (hashed for the response cache), where every
measured number (times, bandwidth, errors) is masked, so a rerun whose timings differ by noise still
hits the cache when the kernels and their outcomes are the same.

Request kinds (`KINDS`): first (a first attempt), optimize (a correct kernel, made faster), repair-build
(rejected by the compiler or the static checks), repair-wrong (built and ran, rejected by the verifier),
repair-format (an answer without usable code). Every kind but repair-format shows the whole task
(`task_context`): the reference, the module it came from, every input and output, the eager time, the
share and the roofline floor, the device, and the lineage; the system prompt, sent with every request,
shows the ABI text, `forge_abi.h` and an example kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from forge.backends import BACKENDS
from forge.kernel import ABI_DIR, TaskSpec

PROMPTS = Path(__file__).resolve().parents[3] / "prompts"  # the checkout's prompts/ (forge/policy/llm/)
KINDS = ("first", "optimize", "repair-build", "repair-wrong", "repair-format")
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
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(PROMPTS), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              autoescape=False)  # noqa: S701 - plain text for a model, never HTML


def render_prompt(name: str, **values: object) -> Prompt:
    """prompts/llm/NAME.md.j2 filled in; a missing value is an error (a bug in forge, not in the model)."""
    text = _env().get_template(f"llm/{name}.md.j2").render(**values)
    return Prompt.of(re.sub(r"\n{3,}", "\n\n", text).strip() + "\n")


def system_prompt(backend: str) -> Prompt:
    """The kernel ABI of the backend, forge_abi.h (native backends), an example kernel, the rules."""
    header = (ABI_DIR / "forge_abi.h").read_text().strip() if BACKENDS[backend].native else ""
    abi = (PROMPTS / f"abi-{backend}.md").read_text().strip()
    example = (PROMPTS / "examples" / BACKENDS[backend].example).read_text().strip()
    return render_prompt("system", backend=backend, lang=LANG[backend], abi=abi, header=header, example=example)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expect = 1
    for s, st in zip(reversed(shape), reversed(stride), strict=True):
        if s != 1 and st != expect:
            return False
        expect *= s
    return True


def tensors(metas: tuple) -> list[dict[str, Any]]:
    """What a prompt shows of each tensor: dtype, shape, strides, whether contiguous."""
    return [{"dtype": m.dtype, "shape": list(m.shape), "strides": list(m.stride),
             "contiguous": _contiguous(tuple(m.shape), tuple(m.stride))} for m in metas]


def _us(value: float | None) -> str:
    return f"{measured(f'{value:.2f}')} us" if value else "not measured yet"


def task_context(spec: TaskSpec, eager_us: float | None = None, floor_us: float | None = None) -> dict[str, Any]:
    """The task as every request shows it; `eager_us`/`floor_us` as the search measured them (else the
    profile's eager time, and the floor unknown until the first evaluation)."""
    eager = eager_us or spec.eager_us
    bandwidth = (f" at the measured memory bandwidth of {measured(f'{spec.floor_bytes / floor_us / 1e3:.0f}')} GB/s"
                 if floor_us and spec.floor_bytes else "")
    return {"key": spec.key, "source": spec.source.strip(), "module": spec.module,
            "module_source": spec.module_source.strip(), "inputs": tensors(spec.inputs),
            "outputs": tensors(spec.outputs), "eager_us": _us(eager),
            "share": measured(f"{100 * spec.share:.1f}") if spec.share else "", "floor_us": _us(floor_us),
            "floor_bytes": spec.floor_bytes, "bandwidth": bandwidth}


def throughput(floor_bytes: int, floor_us: float | None, time_us: float | None) -> str:
    """What a correct kernel's time says of its memory traffic, from measurements the evaluation already made (no
    profiler run): the bandwidth it achieves moving the task's bytes, against the one measured for the floor,
    and whether memory bounds it. "" when either time is unknown."""
    if not (floor_bytes and floor_us and time_us):
        return ""
    reached = floor_us / time_us
    verdict = ("near the memory floor: only moving fewer bytes gains much more" if reached >= 0.7 else
               "far from the memory floor: the time goes to computation, loops that are not vectorised or too "
               "little parallelism, not to memory traffic" if reached < 0.3 else
               "between the two: both memory traffic and computation count")
    return (f"{measured(f'{floor_bytes / time_us / 1e3:.1f}')} GB/s achieved (the task's {floor_bytes} bytes in "
            f"this kernel's time) of the {measured(f'{floor_bytes / floor_us / 1e3:.1f}')} GB/s measured: "
            f"{measured(verdict)}")
