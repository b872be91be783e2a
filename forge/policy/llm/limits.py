"""Limits of LLM requests that hold: money reserved before a request is sent, answers cut to a size, token
counts estimated when a provider gives none, and what a repair turn quotes of an answer.

Important: `Ledger.reserve` takes a request's worst case (every prompt byte a token, and all of its
`max_tokens`, at the model's price) before the request is sent, so the requests in flight together can
never take the spending past `--max-usd`; the real cost replaces the reservation when the answer comes.
"""

from __future__ import annotations

import math
import threading

from forge.kernel import Status

MIN_REQUEST_S = 1.0  # no request is started with less time than this left before the deadline
CHECK_TIMEOUT_S = 15.0  # listing the models before a run (a server that hangs fails within it)
CHARS_PER_TOKEN_CAP = 8  # an answer longer than max_tokens x this is cut (a token is 3-4 characters of code)
QUOTE_CHARS = 6000  # what a repair turn quotes of a malformed answer: its head and its tail


class LLMError(Exception):
    """A request that produced no usable answer (after its retries); inside the search, a failed node.
    `call_id`: the stored call it came from, when it was stored (linked to the failed node); `status`: the
    failed node's status; `usd`: what the failed attempts may have cost (a timed-out request may be billed)."""

    call_id: int | None = None
    status: Status = Status.PROVIDER_ERROR
    usd: float = 0.0


class NotSent(LLMError):
    """The request was never sent: the budget has no room for it, the deadline is too near, a replay miss."""

    status = Status.NOT_ASKED


class BudgetSpent(NotSent):
    """--max-usd has no room for this request's worst case: it is not sent."""


def upper_tokens(text: str) -> int:
    """An upper bound of the tokens of `text` for any byte-level BPE tokenizer: one per byte."""
    return len(text.encode()) + 8


def estimate_tokens(text: str) -> int:
    """The tokens of `text` when a provider reports none: UTF-8 bytes / 4 (no provider ships an offline
    tokenizer for its current models; the estimate is stored marked as one)."""
    return math.ceil(len(text.encode()) / 4) if text else 0


def answer_cap(max_tokens: int) -> int:
    """Characters an answer may have before it is cut (a provider that ignored max_tokens)."""
    return max_tokens * CHARS_PER_TOKEN_CAP


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """An answer as a later turn quotes it: whole when short, else its head and tail around a marker."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n\n[... {len(text) - 2 * half} characters left out ...]\n\n{text[-half:]}"


class Ledger:
    """Dollars spent and reserved under an optional cap, shared by the threads that send requests."""

    def __init__(self, max_usd: float | None) -> None:
        self.max_usd = max_usd
        self.spent = 0.0
        self.reserved = 0.0
        self._lock = threading.Lock()

    def reserve(self, usd: float) -> None:
        """Hold `usd` for a request about to be sent; BudgetSpent when the cap has no room for it."""
        with self._lock:
            if self.max_usd is not None and self.spent + self.reserved + usd > self.max_usd:
                raise BudgetSpent(f"LLM budget: no room for another request (${self.spent:.4f} spent, "
                                  f"${self.reserved:.4f} held by requests in flight, this one may cost up to "
                                  f"${usd:.4f}, --max-usd {self.max_usd:g})")
            self.reserved += usd

    def settle(self, reserved: float, usd: float) -> None:
        """A request is over: its reservation is released and what it cost is spent."""
        with self._lock:
            self.reserved = max(0.0, self.reserved - reserved)
            self.spent += usd

    def stop_reason(self, smallest: float) -> str | None:
        """Why no request can be sent any more (not even one costing `smallest`, the least a request has needed),
        or None."""
        if self.max_usd is not None and self.spent + smallest > self.max_usd:
            return f"LLM budget spent (${self.spent:.4f} of --max-usd {self.max_usd:g})"
        return None
