"""The arena's placement: the same plan, step after step, never lands at the same addresses twice in a row."""

from __future__ import annotations

import torch

from forge.capture.export import TensorMeta
from forge.evaluate.arena import Arena


def test_a_step_planned_as_the_one_before_it_gets_other_addresses() -> None:
    # A verification places each of its sets alone, one step after the other (the judge's Remote.place): a
    # kernel that skips work when its output pointer repeats must never be handed the same one by chance.
    meta = TensorMeta.of(torch.empty(3, 1000))
    arena = Arena("cpu")
    try:
        last = None
        seen = set()
        for _ in range(3000):
            arena.reset()
            (inp,) = arena.plan([meta])
            arena.page()
            out = arena.flat(3000, torch.float32)
            now = (inp.offset, out.offset)
            assert last is None or (now[0] != last[0] and now[1] != last[1])
            last = now
            seen.add(now)
        assert len(seen) > 200  # still drawn at random, not stepped through a few places
    finally:
        arena.close()
