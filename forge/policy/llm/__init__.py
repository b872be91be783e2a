"""LLM policies: OpenAI, Anthropic and OpenAI-compatible servers write and repair kernels in the search.

`make_llm_policy("openai:gpt-4.1", "cpu", store=store)` checks the key with one cheap request and returns
a policy for forge.search.driver; `recipes+` before the name mixes it with the recipe policy. docs/llm.md has
the prompts, the cache, the cost accounting and replay.
"""

from __future__ import annotations

import os
from pathlib import Path

from forge.errors import UserError
from forge.policy.base import CallStore
from forge.policy.llm.cache import CallLog, replay_answers
from forge.policy.llm.mixed import MixedPolicy
from forge.policy.llm.policy import Idea, LLMConfig, LLMPolicy
from forge.policy.llm.prices import PriceTable
from forge.policy.llm.providers import Chat, LLMError, ProviderSpec, RetryConfig, connect, key_of

__all__ = ["Idea", "LLMConfig", "LLMError", "LLMPolicy", "MixedPolicy", "ProviderSpec", "RetryConfig",
           "check_name", "keyholder_chat", "make_llm_policy"]


def check_name(name: str) -> None:
    """What an LLM --policy NAME needs before anything starts (no store made, no model loaded): a name that
    parses and, outside the key holder's child (which has no key by design), its key in the environment."""
    from forge.policy.llm import broker

    try:
        spec = ProviderSpec.parse(name.removeprefix("recipes+"))
    except ValueError as e:
        raise UserError(str(e)) from None
    if broker.ENV not in os.environ:
        key_of(spec)


def keyholder_chat(name: str, *, max_usd: float | None = None, prices: str | Path | None = None,
                   retry: RetryConfig | None = None) -> Chat:
    """The client the key holder (forge.policy.llm.broker) sends requests with, its key checked; bad input is a
    UserError before anything starts."""
    try:
        spec = ProviderSpec.parse(name.removeprefix("recipes+"))
        table = PriceTable(prices)
    except ValueError as e:
        raise UserError(str(e)) from None
    _priced(table, spec, max_usd)
    return connect(spec, retry, price=table.price(spec.provider, spec.model), max_usd=max_usd)


def _priced(table: PriceTable, spec: ProviderSpec, max_usd: float | None) -> None:
    if max_usd is not None and table.get(spec.provider, spec.model) is None and spec.provider != "openai-compatible":
        raise UserError(f"--max-usd needs a price for {spec.name}: add it to a --prices file")


def make_llm_policy(name: str, device: str, *, store: CallStore | None = None, max_usd: float | None = None,
                    replay: str | None = None, prices: str | Path | None = None, retry: RetryConfig | None = None,
                    config: LLMConfig | None = None) -> LLMPolicy | MixedPolicy:
    """The policy for `PROVIDER:MODEL` or `recipes+PROVIDER:MODEL`; bad input is a UserError before any search.

    With `replay`, every answer comes from that run's stored calls (no key, no network).
    """
    from forge.policy.recipes.policy import RecipePolicy

    mixed = name.startswith("recipes+")
    try:
        text = name.removeprefix("recipes+")
        spec = ProviderSpec.stored(text) if replay is not None else ProviderSpec.parse(text)
        table = PriceTable(prices)
    except ValueError as e:
        raise UserError(str(e)) from None
    price = table.price(spec.provider, spec.model)
    _priced(table, spec, max_usd)
    answers = None
    if replay is not None:
        if store is None:
            raise UserError("--replay needs the store that holds the run")
        try:
            answers = replay_answers(store, replay)
        except KeyError:
            raise UserError(f"no run {replay!r} in the store (see --db)") from None
        if not answers:
            raise UserError(f"run {replay} has no stored LLM answers to replay")
    chat = None if replay is not None else connect(spec, retry, price=price, max_usd=max_usd)
    if config is None:
        config = LLMConfig(tune=mixed)
    llm = LLMPolicy(CallLog(spec, chat, price, max_usd=max_usd, replay=answers), device, config=config)
    return MixedPolicy(RecipePolicy(device), llm) if mixed else llm
