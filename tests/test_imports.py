"""The pipeline's forbidden imports (pyproject.toml's [tool.importlinter] contracts), checked by import-linter
on the package as it is, and on a copy with a forbidden import planted (the contracts must catch it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("importlinter", reason="import-linter is in the dev extra")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports run in `root` (its pyproject.toml, its forge package first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_contracts_hold():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_a_planted_forbidden_import_breaks_a_contract(tmp_path):
    shutil.copytree(ROOT / "forge", tmp_path / "forge", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    verify = tmp_path / "forge" / "evaluate" / "verify.py"
    verify.write_text(verify.read_text().replace("import torch\n", "import torch\n\nimport forge.store  # noqa\n", 1))
    r = _lint(tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-3000:]
    assert "forge.evaluate.verify -> forge.store" in r.stdout, r.stdout[-3000:]


def test_an_import_up_the_layers_breaks_the_layers_contract(tmp_path):
    shutil.copytree(ROOT / "forge", tmp_path / "forge", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    base = tmp_path / "forge" / "policy" / "base.py"  # the policy layer reaching up into the review
    planted = "import forge.review  # noqa\nfrom forge.kernel import"
    base.write_text(base.read_text().replace("from forge.kernel import", planted, 1))
    r = _lint(tmp_path)
    assert r.returncode != 0 and "the pipeline in layers" in r.stdout and "BROKEN" in r.stdout, r.stdout[-3000:]
    assert "forge.policy.base -> forge.review" in r.stdout, r.stdout[-3000:]
