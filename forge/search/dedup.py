"""The sources a task's search has evaluated, by normal digest (comments and spacing left out): a source
seen before is stored as a `duplicate` of its first node, with that node's reward, and not evaluated again."""

from __future__ import annotations

from dataclasses import dataclass

from forge.kernel import Candidate, EvalResult, NoKernel, Status


@dataclass(frozen=True)
class First:
    """The first node with a source: its recorded id, its evaluation and reward."""

    node_id: int
    result: EvalResult
    reward: float | None


class Seen:
    """Normal digest -> the first node evaluated with that source."""

    def __init__(self) -> None:
        self._first: dict[str, First] = {}

    def get(self, cand: Candidate) -> First | None:
        """The first node with this source, or None (always None for a NoKernel: nothing was evaluated)."""
        return None if isinstance(cand, NoKernel) else self._first.get(cand.normal_digest)

    def add(self, cand: Candidate, node_id: int, res: EvalResult, reward: float | None) -> None:
        """Remember an evaluated source (the first node wins; a duplicate is never its own original)."""
        if not isinstance(cand, NoKernel) and res.status is not Status.DUPLICATE:
            self._first.setdefault(cand.normal_digest, First(node_id, res, reward))


def duplicate(first: First) -> EvalResult:
    """The stored result of a node whose source is `first`'s: not evaluated, its outcome named."""
    return EvalResult(Status.DUPLICATE, f"the same source as node #{first.node_id} (comments and spacing aside), "
                      f"which ended {first.result.status.value}: not evaluated again",
                      verify={"duplicate_of": first.node_id, "original_status": first.result.status.value})
