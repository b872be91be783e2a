"""CUDA graph replay of a whole forward (GraphReplay), and captures that leave the current stream as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree


@contextmanager
def same_stream() -> Iterator[None]:
    """The current CUDA stream as it was on the way in, also when a capture inside fails: torch.cuda.graph's
    exit raises from capture_end() before it leaves its side stream, and what ran next ran on that one."""
    before = torch.cuda.current_stream()
    try:
        yield
    finally:
        torch.cuda.set_stream(before)


class GraphReplay:
    """A forward captured once as a CUDA graph and then replayed: no per-operator CPU work at all. Each
    call copies its inputs into the captured input buffers and returns clones of the captured outputs
    (the next replay overwrites those). Raises at construction when the forward cannot be captured
    (a CPU synchronisation inside it, say)."""

    def __init__(self, fn: Callable[..., Any], inputs: list[Any], warmup: int = 3) -> None:
        self.static = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():  # lazy initialisations happen outside the capture
            for _ in range(warmup):
                fn(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with same_stream(), torch.no_grad(), torch.cuda.graph(self.graph):
            self.out = fn(*self.static)

    def __call__(self, *inputs: Any) -> Any:
        for s, x in zip(self.static, inputs, strict=True):
            if isinstance(s, torch.Tensor):
                s.copy_(x)
        self.graph.replay()
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.out)
