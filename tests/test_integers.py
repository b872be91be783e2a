"""Integer inputs (forge.evaluate.integers): negatives only where every use allows them; index inputs stay valid."""

from __future__ import annotations

import torch

from forge.capture.export import TensorMeta, capture
from forge.evaluate.integers import LARGE, SMALL, signed_inputs
from forge.evaluate.verify import SETS, Reference, generator, make_flat
from forge.tasks.cut import build_tasks


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e = torch.nn.Embedding(100, 8)

    def forward(self, ids: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.e(ids * 2), torch.gather(x, 1, ids), (torch.abs(n) * 3 - 1) % 5


def _tasks() -> list[tuple[str, tuple[TensorMeta, ...]]]:
    inputs = [torch.randint(0, 40, (4, 8)), torch.randn(4, 100), torch.randint(-5, 5, (4, 8), dtype=torch.int32)]
    return [(t.source, t.inputs) for t in build_tasks(capture(Mixed(), inputs).graph_module.graph)]


def test_index_inputs_stay_unsigned_and_arithmetic_ones_get_negatives() -> None:
    for source, _ in _tasks():
        args = source.split("def region(")[1].split(")")[0]
        signed = signed_inputs(source)
        if "embedding" in source or "gather" in source:  # the index (even through a mul) is never signed
            assert not any(f"in{i}: \"i64" in args for i in signed), source
        else:
            assert signed == frozenset(range(args.count(":"))), source


def test_signed_values_cover_negatives_zeros_and_large_magnitudes() -> None:
    meta = TensorMeta((4096,), "int32", (1,))
    plain = make_flat(meta, 0, generator("cpu", 1), "cpu")
    assert int(plain.min()) == 0 and int(plain.max()) == SMALL - 1
    signed = make_flat(meta, 0, generator("cpu", 1), "cpu", signed=True)
    assert int(signed.min()) == -SMALL and (signed < 0).float().mean() > 0.4
    hard = make_flat(meta, SETS - 1, generator("cpu", 1), "cpu", signed=True)
    assert (hard == 0).any() and int(hard.abs().max()) > 64 and int(hard.abs().max()) <= LARGE
    small = make_flat(TensorMeta((4096,), "int8", (1,)), SETS - 1, generator("cpu", 1), "cpu", signed=True)
    assert int(small.abs().max()) <= SMALL  # no wrap-around in narrow types
    unsigned = make_flat(TensorMeta((4096,), "uint8", (1,)), 0, generator("cpu", 1), "cpu", signed=True)
    assert int(unsigned.min()) >= 0


def test_the_reference_runs_on_every_set_of_every_task() -> None:
    """Signed or not, each task's inputs are valid for its reference (no index out of range)."""
    tasks = _tasks()
    assert any(Reference(source).signed & {j for j, m in enumerate(metas) if m.dtype == "int32"}
               for source, metas in tasks)
    for source, metas in tasks:
        ref = Reference(source)
        for k in range(SETS):
            gen = generator("cpu", k)
            ref([make_flat(m, k, gen, "cpu", j in ref.signed).as_strided(m.shape, m.stride)
                 for j, m in enumerate(metas)])
