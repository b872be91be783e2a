"""Shared test helpers: paths, the `cuda` marker (skipped without an NVIDIA GPU), the review store."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"
TAKEN_OVER = str(Path(__file__).resolve().parent / "taken_over_worker.py")  # a worker's program a candidate took over


class Product(torch.nn.Module):
    """a @ b: a task of many operations a byte (forge.evaluate.measured.renews), for tests/kernels/mm_few_changed.*"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


@pytest.fixture(autouse=True)
def _no_forge_env(monkeypatch):
    """A FORGE_DB or FORGE_OUT in the caller's environment would move every test's store and artifacts; a
    credential (an API key) would reach a real provider, and make every `forge optimize` run in a keyless
    child (forge.policy.llm.broker): tests set the keys they use."""
    from forge.policy.llm.broker import is_credential

    monkeypatch.delenv("FORGE_DB", raising=False)
    monkeypatch.delenv("FORGE_OUT", raising=False)
    for name in [k for k in os.environ if is_credential(k)]:
        monkeypatch.delenv(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rs(tmp_path_factory):
    """The store of a small real search with a hostile node in it (review_store.py), built once a session."""
    from review_store import review_store

    return review_store(tmp_path_factory.getbasetemp() / "review")


@pytest.fixture(scope="session")
def ui(rs, tmp_path_factory):
    """`forge ui` serving `rs`, for the review tests."""
    from review_store import start_ui

    server = start_ui(rs.db, tmp_path_factory.mktemp("ui") / "ui.log")
    yield server
    server.stop()


def lowerable(tasks, lower):
    """(task, lowered) for each task a recipe's `lower` takes; the others are skipped."""
    from forge.kernel import TaskSpec
    from forge.policy.recipes.emit import NotMine

    out = []
    for t in tasks:
        try:
            out.append((t, lower(TaskSpec.of(t))))
        except NotMine:
            pass
    return out


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder any user can reach (/tmp, mode 0755): what keeps a worker of another user out of what is in it
    is the files' permissions alone."""
    folder = Path(tempfile.mkdtemp(prefix="forge-open-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
