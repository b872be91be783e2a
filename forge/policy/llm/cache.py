"""Every LLM request goes through a CallLog: cache or replay, budget, the provider, pricing, the store.

The request hash covers the provider, the model, the system prompt and the conversation with measured
numbers masked (forge.policy.llm.prompts). A request whose hash has an `ok` call in the store is answered from
it at no cost (stored with status `cached`); with `replay` only the calls of that run may answer, and a
request without one fails its node instead of reaching the network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from forge.policy.llm.prices import Price
from forge.policy.llm.prompts import Prompt
from forge.policy.llm.providers import Chat, LLMError, ProviderSpec, Reply
from forge.store import Store

log = logging.getLogger(__name__)

Message = tuple[str, Prompt]  # (role, content)


@dataclass(frozen=True)
class Answer:
    """A reply and where it came from: "network", "cache" or "replay"."""

    reply: Reply
    source: str
    usd: float
    call_id: int | None = None  # the stored call (linked to the candidate the answer becomes)


class BudgetSpent(LLMError):
    """--max-usd is reached: no more requests."""


def request_hash(spec: ProviderSpec, system: Prompt, messages: list[Message], max_tokens: int) -> str:
    """The cache key of a request (measurements masked)."""
    body = {"provider": spec.provider, "model": spec.model, "max_tokens": max_tokens, "system": system.key,
            "messages": [[role, p.key] for role, p in messages]}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class CallLog:
    """Answers requests from the cache, a replayed run, or the provider; records and prices every call."""

    def __init__(self, spec: ProviderSpec, chat: Chat | None, price: Price, *, max_usd: float | None = None,
                 replay: dict[str, str] | None = None, max_tokens: int = 8192) -> None:
        self.spec = spec
        self.chat = chat  # None with replay: no network at all
        self.price = price
        self.max_usd = max_usd
        self.replay = replay
        self.max_tokens = max_tokens
        self.spent = 0.0
        self.calls = 0
        self._lock = threading.Lock()
        self.store: Store | None = None
        self.run_id: str | None = None

    def bind(self, store: Store, run_id: str) -> None:
        """Where calls are recorded (and the cache looked up)."""
        self.store, self.run_id = store, run_id

    def budget_spent(self) -> str | None:
        """Why no more requests may be made, or None."""
        if self.max_usd is not None and self.spent >= self.max_usd:
            return f"LLM budget spent (${self.spent:.4f} of --max-usd {self.max_usd:g})"
        return None

    def ask(self, system: Prompt, messages: list[Message], task_id: int | None = None) -> Answer:
        """The answer to a request; raises LLMError (BudgetSpent, replay miss, provider failure)."""
        h = request_hash(self.spec, system, messages, self.max_tokens)
        prompt = _transcript(system, messages)
        if self.replay is not None:
            if h not in self.replay:
                raise LLMError("replay: the replayed run has no stored answer for this request")
            return self._record(h, prompt, Reply(self.replay[h], 0, 0, "stop"), 0.0, "replayed", task_id, 0.0)
        hit = self.store.find_llm_call(h) if self.store else None
        if hit is not None:
            return self._record(h, prompt, Reply(hit.response, 0, 0, "stop"), 0.0, "cached", task_id, 0.0)
        with self._lock:
            why = self.budget_spent()
        if why:
            raise BudgetSpent(why)
        assert self.chat is not None
        start = time.perf_counter()
        try:
            reply = self.chat.complete(system.text, [{"role": r, "content": p.text} for r, p in messages],
                                       self.max_tokens)
        except LLMError as e:
            e.call_id = self._store(h, prompt, str(e), 0, 0, time.perf_counter() - start, 0.0, "error", task_id)
            raise
        usd = self.price.cost(reply.tokens_in, reply.tokens_out)
        with self._lock:
            self.spent += usd
        refused = reply.stop_reason in ("refusal", "content_filter")
        status = reply.stop_reason if refused else "ok" if reply.text.strip() else "empty"
        return self._record(h, prompt, reply, usd, status, task_id, time.perf_counter() - start)

    def _record(self, h: str, prompt: str, reply: Reply, usd: float, status: str, task_id: int | None,
                latency: float) -> Answer:
        call_id = self._store(h, prompt, reply.text, reply.tokens_in, reply.tokens_out, latency, usd, status,
                              task_id)
        log.info("%s %s: %d+%d tokens, $%.5f, %.2f s", self.spec.name, status, reply.tokens_in, reply.tokens_out,
                 usd, latency)
        if status in ("refusal", "content_filter", "empty"):
            e = LLMError(f"{self.spec.name} gave no kernel: "
                         + ("it refused" if status != "empty" else "the answer was empty")
                         + (f" ({reply.text.strip()[:200]!r})" if reply.text.strip() else ""))
            e.call_id = call_id
            raise e
        source = {"cached": "cache", "replayed": "replay"}.get(status, "network")
        return Answer(reply, source, usd, call_id)

    def _store(self, h: str, prompt: str, response: str, tokens_in: int, tokens_out: int, latency: float,
               usd: float, status: str, task_id: int | None) -> int | None:
        """Count and store one call; its id in the store (None without one)."""
        with self._lock:
            self.calls += 1
            if self.store is None or self.run_id is None:
                return None
            return self.store.add_llm_call(self.run_id, provider=self.spec.provider, model=self.spec.model,
                                           request_hash=h, prompt=prompt, response=response, tokens_in=tokens_in,
                                           tokens_out=tokens_out, latency_s=latency, usd=usd, status=status,
                                           task_id=task_id).id


def _transcript(system: Prompt, messages: list[Message]) -> str:
    """The whole request as stored: system prompt, then each turn under its role."""
    return "\n\n".join([f"## system\n{system.text}", *(f"## {role}\n{p.text}" for role, p in messages)])


def replay_answers(store: Store, run_id: str) -> dict[str, str]:
    """The answers a run received, by request hash (refusals and errors are not answers)."""
    return {c.request_hash: c.response for c in store.llm_calls(run_id)
            if c.status in ("ok", "cached", "replayed")}
