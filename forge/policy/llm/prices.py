"""The price table: USD per million tokens in and out, per provider and model (forge/policy/llm/prices.json).

A model matches its longest listed prefix, so dated snapshots (`gpt-4o-2024-08-06`) take their family's
price. `--prices PATH` (same layout) overrides or adds entries. OpenAI-compatible servers cost nothing
unless listed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_TABLE = Path(__file__).resolve().parent / "prices.json"


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    usd_in: float
    usd_out: float

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """Dollars for one call."""
        return (tokens_in * self.usd_in + tokens_out * self.usd_out) / 1e6


class PriceTable:
    """Prices per provider and model, loaded from the shipped table and an optional override."""

    def __init__(self, override: str | Path | None = None) -> None:
        self.table: dict[str, dict[str, Price]] = {}
        for path in (DEFAULT_TABLE, override):
            if path is not None:
                self._load(Path(path))

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            for provider, models in data.items():
                if provider.startswith("_"):
                    continue
                for model, p in models.items():
                    self.table.setdefault(provider, {})[model] = Price(float(p["in"]), float(p["out"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"Invalid price table {path}: {e!r} (expected {{provider: {{model: "
                             "{\"in\": USD_PER_MTOK, \"out\": USD_PER_MTOK}}}})") from e

    def get(self, provider: str, model: str) -> Price | None:
        """The price of a model (longest matching prefix), or None if it is not listed."""
        models = self.table.get(provider, {})
        hits = [m for m in models if model == m or model.startswith(m + "-") or model.startswith(m + "@")]
        return models[max(hits, key=len)] if hits else None

    def price(self, provider: str, model: str) -> Price:
        """The price, $0 for an unlisted model (with a warning unless it is a local server)."""
        p = self.get(provider, model)
        if p is None:
            if provider != "openai-compatible":
                log.warning("no price for %s:%s: its calls count as $0 (add it with --prices)", provider, model)
            return Price(0.0, 0.0)
        return p
