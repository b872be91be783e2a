"""Output buffers of a verification call: the output inside guard zones, filled with a poison word or finite values
(forge.evaluate.verify places them in the arena; forge.evaluate.verdicts judges them)."""

from __future__ import annotations

import random

import torch

from forge.capture.export import TensorMeta, output_view

_POISON = {torch.float32: (torch.int32, 0x7FC0DEAD), torch.float16: (torch.int16, 0x7E5A),  # NaNs
           torch.bfloat16: (torch.int16, 0x7FDA), torch.float64: (torch.int64, 0x7FF8DEADBEEFDEAD),
           torch.int64: (torch.int64, 0x5A5A5A5A5A5A5A5A), torch.int32: (torch.int32, 0x5A5A5A5A),
           torch.int16: (torch.int16, 0x5A5A), torch.int8: (torch.int8, 0x5A), torch.uint8: (torch.uint8, 0x5A),
           torch.bool: (torch.uint8, 0x5A)}
_NAN = {torch.float32: (torch.int32, 0x7FC00000, 22), torch.float16: (torch.int16, 0x7E00, 9),
        torch.bfloat16: (torch.int16, 0x7FC0, 6), torch.float64: (torch.int64, 0x7FF8000000000000, 51)}
_SYSTEM = random.SystemRandom()  # the guard words: not derived from any seed the worker was sent


class Guarded:
    """An output tensor inside a buffer with guard zones on both sides.

    The output is filled with one poison word (for floats a NaN with a random payload, for 32- and 64-bit
    integers a random value, new for every buffer); the guard zones with random bits, kept to compare: a
    candidate cannot tell a verification buffer by a fixed word before, in or after its output."""

    def __init__(self, meta: TensorMeta, device: str, finite: bool = False, buf: torch.Tensor | None = None
                 ) -> None:
        """`finite`: the output holds random finite values instead of the poison word, as a reused buffer
        would (a kernel that computes only when it sees NaN in its output is caught by the comparison);
        unwritten elements then show as wrong values, not as a partial write. `buf`: where the buffer lives
        (`Guarded.size(meta)` elements of its dtype, shared with the worker), else allocated here."""
        dtype = meta.torch_dtype
        self.finite = finite
        self.meta = meta
        self.guard = self.guard_elements(dtype)
        bits_dtype, self.bits = _POISON[dtype]
        if dtype in _NAN:
            _, base, payload = _NAN[dtype]
            self.bits = _signed(base | _SYSTEM.getrandbits(payload), bits_dtype)
        elif dtype in (torch.int32, torch.int64):
            self.bits = _signed(_SYSTEM.getrandbits(32 if dtype == torch.int32 else 64), bits_dtype)
        self.buf = torch.empty(self.size(meta), dtype=dtype, device=device) if buf is None else buf
        self.raw = self.buf.view(torch.uint8) if dtype == torch.bool else self.buf.view(bits_dtype)
        self.raw.fill_(self.bits)
        g, n = self.guard, meta.numel
        gen = torch.Generator(device=self.raw.device).manual_seed(_SYSTEM.getrandbits(63))
        for zone in (self.raw[:g], self.raw[g + n:]):
            info = torch.iinfo(zone.dtype)
            zone.copy_(torch.randint(info.min, info.max, zone.shape, generator=gen, device=zone.device,
                                     dtype=zone.dtype))
        self._zones = (self.raw[:g].clone(), self.raw[g + n:].clone())
        self.tensor = output_view(self.buf[g:g + n], meta)
        if finite and n:
            fill = torch.randn(n, generator=gen, device=self.raw.device) * 3 if dtype.is_floating_point else \
                torch.randint(0, 2 if dtype == torch.bool else 16, (n,), generator=gen, device=self.raw.device)
            self.buf[g:g + n].copy_(fill.to(dtype))

    def frozen(self) -> Guarded:
        """A copy of the buffer as it is now (taken as a call returns), with this one's poison and guards: what
        is judged, while work the candidate left running can only change the live buffer."""
        copy = object.__new__(Guarded)
        copy.__dict__.update(self.__dict__)
        copy.raw = self.raw.clone()  # the bits (a bool buffer's clone would make its guard bytes 0 or 1)
        copy.buf = copy.raw.view(self.buf.dtype)
        g, n = self.guard, self.meta.numel
        copy.tensor = output_view(copy.buf[g:g + n], self.meta)
        return copy

    @staticmethod
    def guard_elements(dtype: torch.dtype) -> int:
        """Elements of each guard zone."""
        return max(256, 4096 // dtype.itemsize)

    @classmethod
    def size(cls, meta: TensorMeta) -> int:
        """Elements of the whole buffer: the output and its two guard zones."""
        return meta.numel + 2 * cls.guard_elements(meta.torch_dtype)

    def guards_intact(self) -> bool:
        """True if nothing was written outside the output."""
        g, n = self.guard, self.meta.numel
        return bool(torch.equal(self.raw[:g], self._zones[0]) and torch.equal(self.raw[g + n:], self._zones[1]))

    def poisoned(self) -> torch.Tensor:
        """Mask of output elements that still hold the poison (none, for a finite fill)."""
        g, n = self.guard, self.meta.numel
        if self.finite:
            return torch.zeros(self.meta.shape, dtype=torch.bool, device=self.raw.device)
        return output_view(self.raw[g:g + n] == self.bits, self.meta)  # the mask in the output's own layout


def _signed(value: int, dtype: torch.dtype) -> int:
    """An unsigned bit pattern as the signed integer of `dtype`'s width (what fill_ takes)."""
    width = torch.iinfo(dtype).bits
    return value - (1 << width) if value >= 1 << (width - 1) else value
