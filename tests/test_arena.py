"""The arena's placement: the same plan, step after step, never lands at the same addresses twice in a row."""

from __future__ import annotations

import torch

from forge.capture.export import TensorMeta
from forge.evaluate.arena import Arena


def _step(arena: Arena, meta: TensorMeta) -> tuple[int, int, int]:
    """One set placed as the judge places a verification's set alone (Remote.place): its input's and output's
    addresses in this process, and the arena's mapping generation."""
    arena.reset()
    (inp,) = arena.plan([meta])
    arena.page()
    out = arena.flat(3000, torch.float32)
    ref = arena.open()
    return arena.data_ptr + inp.offset, arena.data_ptr + out.offset, ref.generation


def test_a_step_planned_as_the_one_before_it_gets_other_addresses() -> None:
    # A verification places each of its sets alone, one step after the other: a kernel that skips work when its
    # output pointer repeats must never be handed the same one by chance, also when the first step grew the
    # arena (a new mapping).
    meta = TensorMeta.of(torch.empty(3, 1000))
    seen = set()
    for trial in range(40):  # fresh arenas: the first step maps, the second must fit what the first mapped
        arena = Arena("cpu")
        try:
            if trial:  # an earlier step of another plan left the arena at a size near this plan's
                arena.reset()
                arena.flat(128 * trial, torch.float32)
                arena.open()
            last = _step(arena, meta)
            for _ in range(50):
                now = _step(arena, meta)
                assert now[2] == last[2], "the same plan again made the arena grow"
                assert now[0] != last[0] and now[1] != last[1]
                seen.add(now[:2])
                last = now
        finally:
            arena.close()
    assert len(seen) > 200  # still drawn at random, not stepped through a few places
