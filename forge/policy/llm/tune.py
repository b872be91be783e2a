"""Recipe-style tuning of LLM kernels: the knobs a kernel exposes as `#define FORGE_KNOB_<NAME> <int>`
(the system prompt asks for them), doubled and halved, and on the CPU the fast-math flag the recipes use.
"""

from __future__ import annotations

import re

from forge.backends import BACKENDS
from forge.kernel import Candidate

_KNOB = re.compile(r"^([ \t]*#[ \t]*define[ \t]+FORGE_KNOB_(\w+)[ \t]+)(\d+)([ \t]*(?://[^\n]*)?)$", re.M)


def knobs(source: str) -> dict[str, int]:
    """The FORGE_KNOB_ constants a source defines, by name."""
    return {m[2]: int(m[3]) for m in _KNOB.finditer(source)}


def variants(cand: Candidate) -> list[tuple[str, Candidate]]:
    """(label, candidate) for each one-knob change: every knob x2 and /2, and fast-math on the CPU."""
    out = []
    for m in _KNOB.finditer(cand.source):
        value = int(m[3])
        for v in dict.fromkeys((value * 2, value // 2)):
            if v >= 1 and v != value:
                src = cand.source[:m.start()] + f"{m[1]}{v}{m[4]}" + cand.source[m.end():]
                out.append((f"{m[2]}={v}", Candidate(cand.backend, src, cand.entry, cand.flags)))
    if BACKENDS[cand.backend].compiler == "g++":  # GCC's fast math (nvcc's is a recipe knob)
        fast = "-ffast-math" in cand.flags
        flags = tuple(f for f in cand.flags if f != "-ffast-math") if fast else (*cand.flags, "-ffast-math")
        out.append((f"fast_math={'off' if fast else 'on'}", Candidate(cand.backend, cand.source, cand.entry, flags)))
    return out
