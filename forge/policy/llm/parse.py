"""Turn a model's answer into a candidate: extract the code, check it against the ABI before building.

`parse_answer` raises `Malformed` with the reason (no code, forbidden calls, no launcher); the policy
then gives the model one repair turn with that reason. Important: the code is only ever text here: it is
never imported or run in this process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forge.backends import BACKENDS
from forge.evaluate.checks import check
from forge.kernel import Candidate

_OPEN = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*$")
_CLOSE = re.compile(r"^[ \t]*```[ \t]*$")


class Malformed(ValueError):
    """An answer the search cannot use as it is; `candidate` is set when code was found but broke a rule."""

    def __init__(self, reason: str, candidate: Candidate | None = None) -> None:
        super().__init__(reason)
        self.candidate = candidate


@dataclass(frozen=True)
class Block:
    """One fenced block of an answer: its language tag (lower case, "" if none), body, and whether it closed."""

    lang: str
    body: str
    complete: bool


def blocks(text: str) -> list[Block]:
    """The fenced blocks of an answer, in order; a fence still open at the end is an incomplete block."""
    out: list[Block] = []
    lang: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if lang is None:
            m = _OPEN.match(line)
            if m:
                lang, body = m[1].lower(), []
        elif _CLOSE.match(line):
            out.append(Block(lang, "\n".join(body), True))
            lang = None
        else:
            body.append(line)
    if lang is not None:
        out.append(Block(lang, "\n".join(body), False))
    return out


def extract_code(text: str, backend: str) -> str:
    """The kernel source in an answer: the last complete fenced block in the backend's language (or untagged)
    holding the entry point, so a "final version" after a draft wins.

    An unfenced answer that is itself code (starts with #include, import or extern) is taken whole. Raises
    Malformed when the answer was cut off inside its code, or its code is in another language.
    """
    b = BACKENDS[backend]
    entry, langs = b.entry, set(b.fences)
    found = blocks(text)
    done = [x for x in found if x.complete]
    ours = [x for x in done if x.lang in langs or not x.lang]
    for pick in ([x for x in ours if entry in x.body], [x for x in ours if x.lang in langs]):
        if pick:
            return pick[-1].body.strip() + "\n"
    if found and not found[-1].complete:
        raise Malformed(f"the answer is truncated: it ends inside a code block ({len(found[-1].body)} characters "
                        "of code, no closing fence); answer with a shorter complete file")
    foreign = [x for x in done if x.lang and x.lang not in langs and entry in x.body]
    if foreign:
        raise Malformed(f"the code is in a ```{foreign[-1].lang} block, but the {backend} backend takes "
                        f"```{b.prompt_lang} ({', '.join(b.fences)})")
    bare = text.strip()
    if not found and re.match(r"(#include|#pragma|import |from |extern |//|/\*)", bare) and entry in bare:
        return bare + "\n"
    raise Malformed("the answer has no code block" if not found else
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
    inside, words = False, []
    for line in text.splitlines():
        if (_CLOSE if inside else _OPEN).match(line):
            inside = not inside
        elif not inside:
            words.append(line)
    return " ".join(" ".join(words).split())[:300]
