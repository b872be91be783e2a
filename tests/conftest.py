"""Shared test helpers: paths and the `cuda` marker (skipped without an NVIDIA GPU)."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def lowerable(tasks, lower):
    """(task, lowered) for each task a recipe's `lower` takes; the others are skipped."""
    from forge.kernel import TaskSpec
    from forge.recipes.pointwise import NotMine

    out = []
    for t in tasks:
        try:
            out.append((t, lower(TaskSpec.of(t))))
        except NotMine:
            pass
    return out
