"""Turn a model's answer into a candidate: extract the code, check it against the ABI before building.

`parse_answer` raises `Malformed` with the reason (no code, forbidden calls, no launcher); the policy
then gives the model one repair turn with that reason. Important: the code is only ever text here: it is
never imported or run in this process.
"""

from __future__ import annotations

import re

from forge.backends import BACKENDS
from forge.evaluate.checks import check
from forge.kernel import Candidate

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


class Malformed(ValueError):
    """An answer the search cannot use as it is; `candidate` is set when code was found but broke a rule."""

    def __init__(self, reason: str, candidate: Candidate | None = None) -> None:
        super().__init__(reason)
        self.candidate = candidate


def extract_code(text: str, backend: str) -> str:
    """The kernel source in an answer: the fenced block in the backend's language holding the entry point.

    An unfenced answer that is itself code (starts with #include, import or extern) is taken whole.
    """
    entry, langs = BACKENDS[backend].entry, set(BACKENDS[backend].fences)
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    for pick in ([b for lang, b in blocks if lang in langs and entry in b], [b for _, b in blocks if entry in b],
                 [b for lang, b in blocks if lang in langs]):
        if pick:
            return max(pick, key=len).strip() + "\n"
    bare = text.strip()
    if not blocks and re.match(r"(#include|#pragma|import |from |extern |//|/\*)", bare) and entry in bare:
        return bare + "\n"
    raise Malformed("the answer has no code block" if not blocks else
                    f"no code block defines `{entry}` in the {backend} format")


def parse_answer(text: str, backend: str) -> Candidate:
    """The candidate in an answer; raises Malformed for an empty answer, no code, or a static-check failure."""
    if not text.strip():
        raise Malformed("the answer is empty")
    cand = Candidate(backend, extract_code(text, backend))
    problems = check(cand)
    if problems:
        raise Malformed("; ".join(f"{status.value}: {msg}" for status, msg in problems), cand)
    return cand


def prose(text: str) -> str:
    """The model's words outside its code blocks, shortened (what a lineage shows of an approach)."""
    return " ".join(_FENCE.sub(" ", text).split())[:300]
