"""The repeated call (step 2 of forge.evaluate.judge): the candidate called twice on the same buffers, on the two
input SETS that the verifications before and after timing leave out (REPEATED), both calls judged."""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from forge.capture.export import output_view
from forge.evaluate.verdicts import Verdict, off_reference
from forge.evaluate.verify import Reference, Target, fill, generator, make_flat, random_like
from forge.kernel import Status, TaskSpec

REPEATED = (1, 2)  # the scales 3*N(0,1)+0.5 and 10*N(0,1)-1 (forge.evaluate.verify.SCALES)
_SYSTEM = random.SystemRandom()


def skips_repeats(remote: Target, ref: Reference, task: TaskSpec, device: str, seed: int) -> Verdict | None:
    """Called twice on the same buffers, on the REPEATED sets (the scales the verifications leave out), the
    inputs rewritten and the outputs filled with random finite values before each call (no poison to look for),
    both calls judged: a kernel that skips work on a repeated call, or keeps a result keyed on the pointers (the
    allocator often hands a dispatched kernel the same addresses), is a `stale_result` (most judged elements
    as the first call or the fill left them), one wrong otherwise gets its own status; None if right."""
    placed, bufs = remote.place(task.inputs, [(m.numel, m.torch_dtype) for m in task.outputs])
    outputs = [output_view(b, m) for b, m in zip(bufs, task.outputs, strict=True)]
    scramble = generator(device, _SYSTEM.getrandbits(63))
    first: list[torch.Tensor] = []  # the first call's outputs, when judging the second
    for call, k in enumerate(REPEATED):
        gen = generator(device, seed * 1000 + 5 + call)  # not the timing inputs' 7: no set drawn from another's
        flats = [make_flat(m, k, gen, device, j in ref.signed, ref.domains.get(j, ""))
                 for j, m in enumerate(task.inputs)]
        for view, flat in zip(placed, flats, strict=True):
            fill(view, flat)
        for o in outputs:
            o.copy_(random_like(o, scramble))
        filled = [o.clone() for o in outputs]
        remote.call(placed, outputs)
        bad = _judge_repeat(ref, task, flats, outputs, filled, first)
        if bad is not None:
            return bad
        first = [o.clone() for o in outputs]
    return None


def _judge_repeat(ref: Reference, task: TaskSpec, flats: list[torch.Tensor], outputs: list[torch.Tensor],
                  filled: list[torch.Tensor], first: list[torch.Tensor]) -> Verdict | None:
    """One of `skips_repeats`' calls judged against the reference on its inputs (`flats`): a wrong output mostly
    as the fill left it, or the first call (`first`: its outputs, on the second call), is stale. The first call
    is judged so too: a kernel may skip work keyed on something else than its pointers (its count of calls)."""
    eager, high = ref([f.as_strided(m.shape, m.stride) for f, m in zip(flats, task.inputs, strict=True)])
    where = "called again on the same buffers with new inputs" if first else "called on buffers of random values"
    for i, (o, e, h, m) in enumerate(zip(outputs, eager, high, task.outputs, strict=True)):
        name = f"output {i} ({m.short()})"
        bad, finite = off_reference(name, o, e, h, m.dtype, "repeat", i)
        if bad is None:
            continue
        # counted where the right value differs from what was left there (a bool output is half its fill)
        left = (o == filled[i]) & (e != filled[i])
        could = e != filled[i]
        if first:
            left, could = left | ((o == first[i]) & (e != first[i])), could | (e != first[i])
        kept, judged_here = (left & finite).sum(), (could & finite).sum()
        if 2 * int(kept) > int(judged_here):
            return Verdict(Status.STALE_RESULT, f"{name}: not computed when called again on the same buffers "
                           "with new inputs (skips work, or keeps a result, on repeated calls)")
        return replace(bad, message=f"{bad.message}: {where}")
    return None
