"""How a search node's payload is stored and rebuilt (--resume), and a policy failure's stop reason."""

from __future__ import annotations

import logging
from dataclasses import fields, is_dataclass
from typing import Any

from forge.kernel import TaskSpec
from forge.policy.base import Policy

log = logging.getLogger(__name__)


def knobs_of(payload: Any) -> dict[str, Any]:
    """The stored form of a payload: a dataclass's fields, or {"payload": value} for anything else."""
    if is_dataclass(payload) and not isinstance(payload, type):
        return {f.name: getattr(payload, f.name) for f in fields(payload)}
    if payload is None or isinstance(payload, (str, int, float, bool, list, dict)):
        return {"payload": payload}
    return {"payload": repr(payload), "restorable": False}


def policy_error(e: BaseException) -> str:
    """The stop reason of a task whose policy raised."""
    return f"policy error: {type(e).__name__}: {e}"[:300]


def payload_of(policy: Policy, spec: TaskSpec, knobs: dict[str, Any]) -> tuple[Any, bool]:
    """(payload, restored) from stored knobs: the policy's `payload_of` if it has one, else JSON payloads.

    `restored` is False when the payload cannot be re-created; the node then keeps its statistics but is
    never expanded (its stored source still counts as a candidate).
    """
    try:
        return policy.payload_of(spec, knobs), True
    except Exception as e:  # noqa: BLE001 - any policy bug: the node is kept, not expanded
        log.warning("policy %s cannot rebuild payload %s: %s: %s", policy.name, knobs, type(e).__name__, e)
        return knobs, False
