"""Every LLM request goes through a CallLog: cache or replay, deadline, the provider, the store.

The request hash covers the provider, the model, the system prompt and the conversation with measured
numbers masked (forge.policy.llm.prompts). A request whose hash has an answer from the network in the store
(`ok`, `estimated`, `truncated`, `overreported`) is answered from it at no cost (stored as `cached`, or
`cached-cut` for a cut answer); with `replay` only the calls of that run may answer, and a request without
one fails its node instead of reaching the network. The client (forge.policy.llm.providers.Chat) reserves,
prices and bounds each request; the CallLog stores what came back, with a status that says what happened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from forge.kernel import Status
from forge.policy.base import CallStore
from forge.policy.llm.limits import BudgetSpent, LLMError, NotSent
from forge.policy.llm.prices import Price
from forge.policy.llm.prompts import Prompt
from forge.policy.llm.providers import Chat, ProviderSpec, Reply

log = logging.getLogger(__name__)

Message = tuple[str, Prompt]  # (role, content)


@dataclass(frozen=True)
class Answer:
    """A reply and where it came from: "network", "cache" or "replay"."""

    reply: Reply
    source: str
    usd: float
    call_id: int | None = None  # the stored call (linked to the candidate the answer becomes)


__all__ = ["ANSWERED", "Answer", "BudgetSpent", "CallLog", "Message", "replay_answers", "request_hash"]

FROM_NETWORK = ("ok", "estimated", "truncated", "overreported")  # answers the cache may give again
ANSWERED = (*FROM_NETWORK, "cached", "cached-cut", "replayed", "replayed-cut")  # answers a replay gives again
_CUT = ("truncated", "cached-cut", "replayed-cut")
_REFUSED = ("refusal", "content_filter", "empty")
# what a replay gives again as it was (a refusal is refused again, an error is an error again), stored so
_AS_REPLAYED = {"refusal": "replayed-refusal", "content_filter": "replayed-filter", "empty": "replayed-empty",
                "error": "replayed-error"}
_ORIGINAL = {v: k for k, v in _AS_REPLAYED.items()}
Replay = dict[str, list[tuple[str, str]]]  # request hash -> (response, status) in the order the run had them


def request_hash(spec: ProviderSpec, system: Prompt, messages: list[Message], max_tokens: int) -> str:
    """The cache key of a request (measurements masked)."""
    body = {"provider": spec.provider, "model": spec.model, "max_tokens": max_tokens, "system": system.key,
            "messages": [[role, p.key] for role, p in messages]}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class CallLog:
    """Answers requests from the cache, a replayed run, or the provider; records and prices every call."""

    def __init__(self, spec: ProviderSpec, chat: Chat | None, price: Price, *, max_usd: float | None = None,
                 replay: Replay | None = None, max_tokens: int = 8192) -> None:
        self.spec = spec
        self.chat = chat  # None with replay: no network at all
        self.price = price
        self.max_usd = max_usd
        if chat is not None:  # the chat reserves, prices and caps each request (forge.policy.llm.limits.Ledger)
            chat.price = price
            if max_usd is not None:
                chat.ledger.max_usd = max_usd
        self.replay = replay
        self.max_tokens = max_tokens
        self.deadline: float | None = None  # time.monotonic() by which every request must be over
        self.calls = 0
        self._lock = threading.Lock()
        self.store: CallStore | None = None
        self.run_id: str | None = None

    @property
    def spent(self) -> float:
        """Dollars spent on requests so far."""
        return self.chat.ledger.spent if self.chat is not None else 0.0

    def bind(self, store: CallStore, run_id: str) -> None:
        """Where calls are recorded (and the cache looked up)."""
        self.store, self.run_id = store, run_id

    def budget_spent(self) -> str | None:
        """Why no more requests may be made, or None."""
        return self.chat.stop_reason(self.max_tokens) if self.chat is not None else None

    def close(self) -> None:
        """No more requests (the search is over): the client refuses any later one."""
        if self.chat is not None:
            self.chat.close()

    def ask(self, system: Prompt, messages: list[Message], task_id: int | None = None) -> Answer:
        """The answer to a request; raises LLMError (BudgetSpent, replay miss, provider failure)."""
        h = request_hash(self.spec, system, messages, self.max_tokens)
        prompt = _transcript(system, messages)
        if self.replay is not None:
            return self._replayed(h, prompt, task_id)
        hit = self.store.find_llm_call(h, status=FROM_NETWORK) if self.store else None
        if hit is not None:
            cut = hit.status == "truncated"
            return self._record(h, prompt, Reply(hit.response, 0, 0, "length" if cut else "stop"), 0.0,
                                "cached-cut" if cut else "cached", task_id, 0.0)
        assert self.chat is not None
        start = time.perf_counter()
        try:
            reply = self.chat.complete(system.text, [{"role": r, "content": p.text} for r, p in messages],
                                       self.max_tokens, deadline=self.deadline)
        except NotSent:
            raise  # nothing was sent: nothing to store
        except LLMError as e:
            e.call_id = self._store(h, prompt, str(e), 0, 0, time.perf_counter() - start, e.usd, "error", task_id)
            raise
        refused = reply.stop_reason in ("refusal", "content_filter")
        status = (reply.stop_reason if refused else "empty" if not reply.text.strip() else
                  "truncated" if reply.truncated else "estimated" if reply.estimated else
                  "overreported" if reply.overreported else "ok")
        return self._record(h, prompt, reply, reply.usd, status, task_id, time.perf_counter() - start)

    def _replayed(self, h: str, prompt: str, task_id: int | None) -> Answer:
        """The replayed run's answer to the request, as it was: an answer, a refusal or an error (raised)."""
        with self._lock:
            stored = self.replay.get(h) if self.replay is not None else None
            if not stored:
                raise NotSent("replay: the replayed run has no stored answer for this request")
            text, status = stored.pop(0) if len(stored) > 1 else stored[0]  # in order; the last one repeats
        if status == "error":
            e = LLMError(text)
            e.call_id = self._store(h, prompt, text, 0, 0, 0.0, 0.0, _AS_REPLAYED[status], task_id)
            raise e
        if status in _REFUSED:
            return self._record(h, prompt, Reply(text, 0, 0, "stop"), 0.0, _AS_REPLAYED[status], task_id, 0.0)
        cut = status in _CUT
        return self._record(h, prompt, Reply(text, 0, 0, "length" if cut else "stop"), 0.0,
                            "replayed-cut" if cut else "replayed", task_id, 0.0)

    def _record(self, h: str, prompt: str, reply: Reply, usd: float, status: str, task_id: int | None,
                latency: float) -> Answer:
        call_id = self._store(h, prompt, reply.text, reply.tokens_in, reply.tokens_out, latency, usd, status,
                              task_id)
        log.info("%s %s: %d+%d tokens, $%.5f, %.2f s", self.spec.name, status, reply.tokens_in, reply.tokens_out,
                 usd, latency)
        refused = _ORIGINAL.get(status, status)
        if refused in _REFUSED:
            e = LLMError(f"{self.spec.name} gave no kernel: "
                         + ("it refused" if refused != "empty" else "the answer was empty")
                         + (f" ({reply.text.strip()[:200]!r})" if reply.text.strip() else ""))
            e.call_id, e.status = call_id, Status.REFUSED
            raise e
        source = {"cached": "cache", "replayed": "replay"}.get(status.removesuffix("-cut"), "network")
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


def replay_answers(store: CallStore, run_id: str) -> Replay:
    """What a run received, by request hash, in order: (text, status), refusals and errors (with their stored
    words) too, so that a replay fails those nodes as they failed; a replayed refusal or error counts as the
    original. Requests never sent (not_asked) were never stored: a replay does not send them either."""
    out: Replay = {}
    for c in store.llm_calls(run_id):
        status = _ORIGINAL.get(c.status, c.status)
        if status in ANSWERED or status in _AS_REPLAYED:
            out.setdefault(c.request_hash, []).append((c.response, status))
    return out
