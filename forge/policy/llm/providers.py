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
from dataclasses import dataclass
from typing import Any

from forge.errors import UserError

log = logging.getLogger(__name__)

PROVIDERS = ("openai", "anthropic", "openai-compatible")
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY",
           "openai-compatible": "OPENAI_COMPATIBLE_API_KEY"}
# scheme://host[:port][/path without colons]:MODEL (the model may contain colons: "qwen2.5-coder:7b")
_COMPATIBLE = re.compile(r"^(https?://[^/:\s]+(?::\d+)?(?:/[^:\s]*)?):(\S+)$")


class LLMError(Exception):
    """A request that produced no usable answer (after its retries); inside the search, a failed node.
    `call_id`: the stored call it came from, when it was stored (linked to the failed node)."""

    call_id: int | None = None


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
        """provider:model (no URL: the cache key and the run's policy name stay the same across servers)."""
        return f"{self.provider}:{self.model}"

    @property
    def key_env(self) -> str:
        """The environment variable the key is read from."""
        return KEY_ENV[self.provider]


@dataclass(frozen=True)
class Reply:
    """One answer: its text, the provider's token counts, and why generation stopped."""

    text: str
    tokens_in: int
    tokens_out: int
    stop_reason: str  # "stop" | "length" | "refusal" | "content_filter" | ...


@dataclass(frozen=True)
class RetryConfig:
    """Bounded retries: 429 waits retry-after (or backs off), timeouts and 5xx back off exponentially."""

    attempts: int = 5  # requests per call, the first one included
    base_s: float = 1.0  # first backoff; doubles each retry, with jitter
    max_wait_s: float = 60.0  # longest single wait, retry-after included
    timeout_s: float = 300.0  # per request


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
    """A chat client of one provider; subclasses send one request, this class retries."""

    def __init__(self, spec: ProviderSpec, api_key: str, retry: RetryConfig) -> None:
        self.spec = spec
        self.retry = retry
        self._client = self._make_client(api_key)  # the key lives in the client only

    def _make_client(self, api_key: str) -> Any:
        raise NotImplementedError

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int) -> Reply:
        raise NotImplementedError

    def _list_models(self) -> None:
        raise NotImplementedError

    def complete(self, system: str, messages: list[dict[str, str]], max_tokens: int = 8192,
                 sleep: Callable[[float], None] = time.sleep) -> Reply:
        """One answer, retrying rate limits, timeouts, 5xx and unreadable bodies; raises LLMError."""
        last = ""
        for attempt in range(self.retry.attempts):
            try:
                return self._send(system, messages, max_tokens)
            except Exception as e:  # noqa: BLE001 - every SDK fault is classified below
                kind, asked = _classify(e)
                last = _describe(e)
                if kind == "auth":
                    raise LLMError(f"{self.spec.provider} rejected the API key ({last.split(':')[0]})") from e
                if kind == "fatal" or attempt + 1 == self.retry.attempts:
                    break
                backoff = self.retry.base_s * 2 ** attempt * (1 + 0.25 * random.random())
                wait = min(self.retry.max_wait_s, asked if asked is not None else backoff)
                log.info("%s: %s; retry %d/%d in %.2f s", self.spec.name, last, attempt + 1,
                         self.retry.attempts - 1, wait)
                sleep(wait)
        raise LLMError(f"{self.spec.name}: no answer after {attempt + 1} request(s): {last}")

    def check(self) -> None:
        """One cheap request (list models) so a rejected key or a wrong URL fails before any search."""
        try:
            self._list_models()
        except Exception as e:  # noqa: BLE001
            kind, _ = _classify(e)
            where = self.spec.base_url or "its API"
            if kind == "auth":
                raise UserError(f"{self.spec.provider} rejected the API key in {self.spec.key_env} "
                                f"({_describe(e).split(':')[0]}): check the key") from None
            raise UserError(f"cannot reach {self.spec.provider} at {where}: {_describe(e)}") from None


class OpenAIChat(Chat):
    """OpenAI Chat Completions (also the OpenAI-compatible servers)."""

    def _make_client(self, api_key: str) -> Any:
        import openai

        return openai.OpenAI(api_key=api_key, base_url=self.spec.base_url, max_retries=0,
                             timeout=self.retry.timeout_s)

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int) -> Reply:
        # OpenAI's reasoning models take max_completion_tokens only; local servers know max_tokens best
        limit = {"max_completion_tokens" if self.spec.provider == "openai" else "max_tokens": max_tokens}
        resp = self._client.chat.completions.create(
            model=self.spec.model, messages=[{"role": "system", "content": system}, *messages], **limit)
        if not resp.choices:
            return Reply("", _tokens(resp, "prompt_tokens"), _tokens(resp, "completion_tokens"), "empty")
        choice = resp.choices[0]
        refusal = getattr(choice.message, "refusal", None)
        text = choice.message.content or ""
        stop = "refusal" if refusal else (choice.finish_reason or "stop")
        return Reply(text or (refusal or ""), _tokens(resp, "prompt_tokens"), _tokens(resp, "completion_tokens"),
                     stop)

    def _list_models(self) -> None:
        self._client.models.list()


class AnthropicChat(Chat):
    """Anthropic Messages."""

    def _make_client(self, api_key: str) -> Any:
        import anthropic

        return anthropic.Anthropic(api_key=api_key, base_url=self.spec.base_url, max_retries=0,
                                   timeout=self.retry.timeout_s)

    def _send(self, system: str, messages: list[dict[str, str]], max_tokens: int) -> Reply:
        resp = self._client.messages.create(model=self.spec.model, system=system, messages=messages,
                                            max_tokens=max_tokens)
        text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
        return Reply(text, _tokens(resp, "input_tokens"), _tokens(resp, "output_tokens"),
                     resp.stop_reason or "stop")

    def _list_models(self) -> None:
        self._client.models.list(limit=1)


def _tokens(resp: Any, field: str) -> int:
    usage = getattr(resp, "usage", None)
    return int(getattr(usage, field, 0) or 0)


def connect(spec: ProviderSpec, retry: RetryConfig | None = None, check: bool = True) -> Chat:
    """A client for the spec with the key from the environment; missing or rejected keys are UserErrors."""
    key = os.environ.get(spec.key_env, "")
    if not key and spec.provider != "openai-compatible":
        raise UserError(f"{spec.key_env} is not set: export it to use --policy {spec.name} (or use --replay RUN)")
    cls = AnthropicChat if spec.provider == "anthropic" else OpenAIChat
    chat = cls(spec, key or "none", retry or RetryConfig())  # local servers take any key
    if check:
        chat.check()
    return chat
