"""Language-model providers through their official SDKs: OpenAI, Anthropic, OpenAI-compatible servers.

`--policy openai:MODEL`, `anthropic:MODEL`, `openai-compatible:BASE_URL:MODEL` (vLLM, SGLang, Ollama,
llama.cpp's server). Keys come from the environment and go to the SDK client only: never into a log line,
an error message, the store or a worker. The SDKs' own retries are off (`max_retries=0`); `Chat.complete`
retries here, so that 429s honour retry-after and every fault has a bounded number of attempts.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from forge.errors import UserError
from forge.policy.llm.deadline import Watchdog
from forge.policy.llm.limits import (
    CHECK_TIMEOUT_S,
    MIN_REQUEST_S,
    Ledger,
    LLMError,  # noqa: F401 - re-exported: where the policy and the tests import it from
    NotSent,
    answer_cap,
    estimate_tokens,
    upper_tokens,
)
from forge.policy.llm.prices import Price

log = logging.getLogger(__name__)

PROVIDERS = ("openai", "anthropic", "openai-compatible")
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY",
           "openai-compatible": "OPENAI_COMPATIBLE_API_KEY"}
# scheme://host[:port][/path without colons]:MODEL (the model may contain colons: "qwen2.5-coder:7b")
_COMPATIBLE = re.compile(r"^(https?://[^/:\s]+(?::\d+)?(?:/[^:\s]*)?):(\S+)$")


@dataclass(frozen=True)
class ProviderSpec:
    """Which provider and model a policy talks to."""

    provider: str
    model: str
    base_url: str | None = None

    @classmethod
    def parse(cls, text: str) -> ProviderSpec:
        """`openai:MODEL`, `anthropic:MODEL` or `openai-compatible:BASE_URL:MODEL`."""
        provider, _, rest = text.partition(":")
        if provider == "openai-compatible":
            m = _COMPATIBLE.match(rest)
            if not m:
                raise ValueError(f"Invalid policy {text!r}: use openai-compatible:BASE_URL:MODEL, e.g. "
                                 "openai-compatible:http://localhost:8000/v1:qwen2.5-coder")
            return cls(provider, m[2], m[1])
        if provider not in PROVIDERS or not rest:
            raise ValueError(f"Invalid policy {text!r}: use recipes, openai:MODEL, anthropic:MODEL or "
                             "openai-compatible:BASE_URL:MODEL (and recipes+ before an LLM policy to mix)")
        return cls(provider, rest)

    @property
    def name(self) -> str:
        """What --policy says: provider:model, with the server's URL for openai-compatible (the run's policy
        name, which --replay parses again; the cache key has no URL: the same model behind another server)."""
        url = f"{self.base_url}:" if self.provider == "openai-compatible" and self.base_url else ""
        return f"{self.provider}:{url}{self.model}"

    @classmethod
    def stored(cls, text: str) -> ProviderSpec:
        """The spec of a stored run's policy name, for --replay: also the URL-less openai-compatible:MODEL that
        runs stored before the URL was kept (a replay sends nothing, so it needs no URL)."""
        try:
            return cls.parse(text)
        except ValueError:
            provider, _, model = text.partition(":")
            if provider == "openai-compatible" and model:
                return cls(provider, model)
            raise

    @property
    def key_env(self) -> str:
        """The environment variable the key is read from."""
        return KEY_ENV[self.provider]


@dataclass(frozen=True)
class Reply:
    """One answer: its text, the provider's token counts, why generation stopped, and what it cost."""

    text: str
    tokens_in: int
    tokens_out: int
    stop_reason: str  # "stop" | "length" (cut: max_tokens or forge's size cap) | "refusal" | "content_filter" | ...
    usd: float = 0.0
    estimated: bool = False  # the provider gave no usage: the tokens are estimated from the text
    overreported: bool = False  # the provider reported more tokens than the request allows: charged at its bound

    @property
    def truncated(self) -> bool:
        """The answer was cut before its end."""
        return self.stop_reason == "length"


@dataclass(frozen=True)
class RetryConfig:
    """Bounded retries: 429 waits retry-after (or backs off), timeouts and 5xx back off exponentially."""

    attempts: int = 5  # requests per call, the first one included
    base_s: float = 1.0  # first backoff; doubles each retry, with jitter
    max_wait_s: float = 60.0  # longest single wait, retry-after included
    timeout_s: float = 300.0  # per request, at most: never past the deadline (forge.policy.base.Policy.until)


def retry_after(headers: Any) -> float | None:
    """Seconds a 429/503 asks us to wait: `retry-after-ms`, or `retry-after` in seconds or as an HTTP date."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


def _classify(e: Exception) -> tuple[str, float | None]:
    """("retry" | "fatal" | "auth", wait asked by the server) for an SDK exception (both SDKs share names)."""
    name = type(e).__name__
    status = getattr(e, "status_code", None)
    response = getattr(e, "response", None)
    if status in (401, 403) or name in ("AuthenticationError", "PermissionDeniedError"):
        return "auth", None
    if status == 429 or name == "RateLimitError":
        return "retry", retry_after(getattr(response, "headers", None))
    if name in ("APITimeoutError", "APIConnectionError", "APIResponseValidationError") or isinstance(e, ValueError):
        return "retry", None  # ValueError: a body that is not JSON
    if isinstance(status, int) and status >= 500:
        return "retry", retry_after(getattr(response, "headers", None))
    return "fatal", None


def _describe(e: Exception) -> str:
    status = getattr(e, "status_code", None)
    what = f"HTTP {status}" if status else type(e).__name__
    return f"{what}: {str(e).splitlines()[0][:200]}" if str(e) else what


class Chat:
    """A chat client of one provider; subclasses send one request, this class retries, bounds and prices."""

    def __init__(self, spec: ProviderSpec, api_key: str, retry: RetryConfig, price: Price | None = None,
                 max_usd: float | None = None) -> None:
        self.spec = spec
        self.retry = retry
        self.price = price or Price(0.0, 0.0)
        self.ledger = Ledger(max_usd)
        self.least_worst = 0.0  # the smallest worst case of a request so far (what the next one needs at least)
        self.watch = Watchdog()  # each request ends by its deadline, however slowly the server sends
        self.closed = False
        self._client = self._make_client(api_key)  # the key lives in the client only

    def _make_client(self, api_key: str) -> Any:
        raise NotImplementedError

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float) -> Reply:
        raise NotImplementedError

    def _list_models(self, timeout: float) -> None:
        raise NotImplementedError

    def stop_reason(self, max_tokens: int) -> str | None:
        """Why no request may be sent any more (--max-usd has no room for one), or None."""
        return self.ledger.stop_reason(max(self.least_worst, self.price.cost(0, max_tokens)))

    def complete(self, system: str, messages: list[dict[str, str]], max_tokens: int = 8192,
                 deadline: float | None = None, sleep: Callable[[float], None] = time.sleep) -> Reply:
        """One answer, retrying rate limits, timeouts, 5xx and unreadable bodies; raises LLMError.

        Each request waits at most until `deadline` (time.monotonic()), and its worst-case cost is reserved in
        the ledger before it is sent (BudgetSpent when there is no room); a timed-out request counts at its
        worst case (the provider may have billed it)."""
        if self.closed:
            raise NotSent("the search is over: no more LLM requests")
        last, lost = "", 0.0
        worst = self.price.cost(upper_tokens(system) + sum(upper_tokens(m["content"]) for m in messages), max_tokens)
        self.least_worst = min(self.least_worst, worst) if self.least_worst else worst
        for attempt in range(self.retry.attempts):
            timeout = self._timeout(deadline, attempt, last)
            self.ledger.reserve(worst)
            guard = None
            try:
                with self.watch.until(time.monotonic() + timeout) as guard:  # the whole request, not each read
                    sent = self._send(system, messages, max_tokens, timeout)
                reply = self._bounded(sent, system, messages, max_tokens)
            except Exception as e:  # noqa: BLE001 - every SDK fault is classified below
                timed_out = "Timeout" in type(e).__name__
                # the watchdog shut the connection at the deadline (a server still sending, slowly)
                cut = guard is not None and guard.fired and not timed_out
                self.ledger.settle(worst, worst if timed_out or cut else 0.0)
                lost += worst if timed_out or cut else 0.0
                kind, asked = ("retry", None) if cut else _classify(e)
                last = f"Timeout: the request outlasted {timeout:.1f} s (its connection was cut)" if cut else \
                    _describe(e)
                if kind == "auth":
                    raise _failed(f"{self.spec.provider} rejected the API key ({last.split(':')[0]})", lost) from e
                if kind == "fatal" or attempt + 1 == self.retry.attempts:
                    break
                wait = self._backoff(attempt, asked, deadline)
                if wait is None:
                    break
                log.info("%s: %s; retry %d/%d in %.2f s", self.spec.name, last, attempt + 1,
                         self.retry.attempts - 1, wait)
                sleep(wait)
                continue
            self.ledger.settle(worst, reply.usd)
            return replace(reply, usd=reply.usd + lost)
        raise _failed(f"{self.spec.name}: no answer after {attempt + 1} request(s): {last}", lost)

    def _timeout(self, deadline: float | None, attempt: int, last: str) -> float:
        """This request's timeout: the configured one, cut to the time left; NotSent when too little is left."""
        if deadline is None:
            return self.retry.timeout_s
        left = deadline - time.monotonic()
        if left < MIN_REQUEST_S:
            e = NotSent("the search's deadline came before the request was sent") if attempt == 0 else \
                _failed(f"{self.spec.name}: no answer by the search's deadline after {attempt} request(s): {last}", 0.0)
            raise e
        return min(self.retry.timeout_s, left)

    def _backoff(self, attempt: int, asked: float | None, deadline: float | None) -> float | None:
        """Seconds to wait before the next attempt (retry-after, else exponential with jitter), or None when
        the next attempt would start too near the deadline."""
        backoff = self.retry.base_s * 2 ** attempt * (1 + 0.25 * random.random())
        wait = min(self.retry.max_wait_s, asked if asked is not None else backoff)
        if deadline is not None and time.monotonic() + wait > deadline - MIN_REQUEST_S:
            return None
        return wait

    def _bounded(self, reply: Reply, system: str, messages: list[dict[str, str]], max_tokens: int) -> Reply:
        """The reply priced, its usage estimated when the provider gave none (tokens < 0), cut at the size cap
        or where the provider says it stopped at max_tokens (flagged as cut: stop_reason "length").

        Important: what is charged never passes what was reserved: input tokens at most one per prompt byte (+8),
        output tokens at most max_tokens. A provider that reports more (a bug, or a server that ignores
        max_tokens) is charged at those bounds and the reply is flagged `overreported`; the counts it reported
        are kept."""
        estimated = reply.tokens_in < 0 or reply.tokens_out < 0
        upper_in = upper_tokens(system) + sum(upper_tokens(m["content"]) for m in messages)
        tokens_in = reply.tokens_in if reply.tokens_in >= 0 else \
            estimate_tokens(system) + sum(estimate_tokens(m["content"]) for m in messages)
        tokens_out = reply.tokens_out if reply.tokens_out >= 0 else estimate_tokens(reply.text)
        over = (reply.tokens_in > upper_in or reply.tokens_out > max_tokens) and not estimated
        if over:
            log.warning("%s reported %d+%d tokens for a request of at most %d+%d: charged at those bounds",
                        self.spec.name, tokens_in, tokens_out, upper_in, max_tokens)
        text, stop = reply.text, reply.stop_reason
        if stop in ("max_tokens", "length") or len(text) > answer_cap(max_tokens):
            text, stop = text[:answer_cap(max_tokens)], "length"
        return replace(reply, text=text, tokens_in=tokens_in, tokens_out=tokens_out, stop_reason=stop,
                       usd=self.price.cost(min(tokens_in, upper_in), min(tokens_out, max_tokens)),
                       estimated=estimated, overreported=over)

    def check(self) -> None:
        """One cheap request (list models) so a rejected key or a wrong URL fails before any search."""
        timeout = min(self.retry.timeout_s, CHECK_TIMEOUT_S)
        guard = None
        try:
            with self.watch.until(time.monotonic() + timeout) as guard:  # a server listing them a byte a second too
                self._list_models(timeout)
        except Exception as e:  # noqa: BLE001
            if guard is not None and guard.fired:
                raise UserError(f"cannot reach {self.spec.provider} at {self.spec.base_url or 'its API'}: no "
                                f"answer within {timeout:.0f} s") from None
            kind, _ = _classify(e)
            where = self.spec.base_url or "its API"
            if kind == "auth":
                raise UserError(f"{self.spec.provider} rejected the API key in {self.spec.key_env} "
                                f"({_describe(e).split(':')[0]}): check the key") from None
            raise UserError(f"cannot reach {self.spec.provider} at {where}: {_describe(e)}") from None

    def lost(self) -> str | None:
        """Why no request can reach the provider any more, for the rest of the run (the key holder is gone), or
        None."""
        return None

    def close(self) -> None:
        """No more requests: any later one is refused unsent (NotSent). Requests still going end at their
        deadline; the client is left open under them (each request's connection is its own, closed after it)."""
        self.closed = True


def _failed(message: str, usd: float) -> LLMError:
    e = LLMError(message)
    e.usd = usd
    return e


class OpenAIChat(Chat):
    """OpenAI Chat Completions (also the OpenAI-compatible servers)."""

    def _make_client(self, api_key: str) -> Any:
        import openai

        return openai.OpenAI(api_key=api_key, base_url=self.spec.base_url, max_retries=0,
                             timeout=self.retry.timeout_s,
                             http_client=openai.DefaultHttpxClient(event_hooks=self.watch.hooks))

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float) -> Reply:
        # OpenAI's reasoning models take max_completion_tokens only; local servers know max_tokens best
        limit = {"max_completion_tokens" if self.spec.provider == "openai" else "max_tokens": max_tokens}
        resp = self._client.chat.completions.create(
            model=self.spec.model, messages=[{"role": "system", "content": system}, *messages], timeout=timeout,
            **limit)
        if not resp.choices:
            return Reply("", _tokens(resp, "prompt_tokens"), _tokens(resp, "completion_tokens"), "empty")
        choice = resp.choices[0]
        refusal = getattr(choice.message, "refusal", None)
        text = choice.message.content or ""
        stop = "refusal" if refusal else (choice.finish_reason or "stop")
        return Reply(text or (refusal or ""), _tokens(resp, "prompt_tokens"), _tokens(resp, "completion_tokens"),
                     stop)

    def _list_models(self, timeout: float) -> None:
        self._client.models.list(timeout=timeout)


class AnthropicChat(Chat):
    """Anthropic Messages."""

    def _make_client(self, api_key: str) -> Any:
        import anthropic

        return anthropic.Anthropic(api_key=api_key, base_url=self.spec.base_url, max_retries=0,
                                   timeout=self.retry.timeout_s,
                                   http_client=anthropic.DefaultHttpxClient(event_hooks=self.watch.hooks))

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float) -> Reply:
        resp = self._client.messages.create(model=self.spec.model, system=system, messages=messages,
                                            max_tokens=max_tokens, timeout=timeout)
        text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
        return Reply(text, _tokens(resp, "input_tokens"), _tokens(resp, "output_tokens"),
                     resp.stop_reason or "stop")

    def _list_models(self, timeout: float) -> None:
        self._client.models.list(limit=1, timeout=timeout)


def _tokens(resp: Any, field: str) -> int:
    """A usage count of the response; -1 when the provider reported none (Chat._bounded estimates it)."""
    value = getattr(getattr(resp, "usage", None), field, None)
    return int(value) if isinstance(value, (int, float)) else -1


def key_of(spec: ProviderSpec) -> str:
    """The spec's API key from the environment ("" for a local server, which takes any); UserError when missing."""
    key = os.environ.get(spec.key_env, "")
    if not key and spec.provider != "openai-compatible":
        raise UserError(f"{spec.key_env} is not set: export it to use --policy {spec.name} (or use --replay RUN)")
    return key


def connect(spec: ProviderSpec, retry: RetryConfig | None = None, check: bool = True, price: Price | None = None,
            max_usd: float | None = None) -> Chat:
    """A client for the spec with the key from the environment; missing or rejected keys are UserErrors.

    Under `forge optimize` with keys in the environment the key holder is another process (forge.policy.llm.broker):
    the client returned then sends its requests there and holds no key."""
    from forge.policy.llm import broker

    if broker.ENV in os.environ:
        return broker.RemoteChat(spec, retry or RetryConfig(), price, max_usd)
    key = key_of(spec)
    cls = AnthropicChat if spec.provider == "anthropic" else OpenAIChat
    chat = cls(spec, key or "none", retry or RetryConfig(), price, max_usd)  # local servers take any key
    if check:
        chat.check()
    return chat
