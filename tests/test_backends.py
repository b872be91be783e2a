"""The backend table (forge.backends) is the one place a backend is told apart by its name."""

import re

import pytest
from conftest import ROOT

from forge.backends import BACKENDS, backend, of_file
from forge.kernel import Candidate

_NAME = "|".join(BACKENDS)
# a comparison with a backend's name, or a dict keyed by them: a switch on the name outside the table
_SWITCH = re.compile(rf'backend\w*\)?\s*(==|!=)\s*"({_NAME})"|\{{\s*"({_NAME})"\s*:[^}}]*"({_NAME})"\s*:')


def test_no_module_switches_on_a_backend_name_outside_the_table():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted((ROOT / "forge").rglob("*.py")) if p.name != "backends.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if _SWITCH.search(line)]
    assert found == []


def test_the_table_says_how_files_and_names_map():
    assert of_file(".cu") is BACKENDS["cuda"] and of_file(".cc") is BACKENDS["cpu"] and of_file(".rs") is None
    assert Candidate("triton", "def launch(): pass\n").entry == BACKENDS["triton"].entry == "launch"
    with pytest.raises(ValueError, match="Invalid backend: 'rust' \\(use one of cpu, cuda, triton, helion\\)"):
        backend("rust")
    with pytest.raises(ValueError, match="Invalid backend"):
        Candidate("rust", "")
