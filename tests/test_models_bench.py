"""benchmarks/models.py's merging of a row measured in parts (one device call each): speedups, an unfinished
compilation, the eager a row shows, and parts from different devices refused."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def models() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # models.py imports its neighbours (breakdown, provenance)
    try:
        spec = importlib.util.spec_from_file_location("bench_models", BENCH / "models.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _row(parts: list[str], eager: float, **ms: float) -> dict:
    return {"model": "q", "dtype": "bf16", "parts": parts, "eager_ms": eager, "device": "GPU", "commit": "c",
            "spread": {"eager": [eager - 1, eager + 1], **{k.removesuffix("_ms"): [v, v] for k, v in ms.items()}},
            **ms}


def _collect(models: ModuleType, tmp_path: Path, rows: list[dict]) -> dict:
    files = []
    for i, r in enumerate(rows):
        f = tmp_path / f"{i}.json"
        f.write_text(json.dumps([r]))
        files.append(str(f))
    into = tmp_path / "into.json"
    into.unlink(missing_ok=True)
    (row,) = models.collect(files, str(into))
    return row


def test_parts_in_any_order_give_one_row(models: ModuleType, tmp_path: Path) -> None:
    forge, comp, ro = (_row(["forge"], 130.0, forge_ms=33.0), _row(["compile"], 120.0, compile_ms=40.0),
                       _row(["compile_ro"], 125.0, compile_ro_ms=36.0))
    failed = {"model": "q", "dtype": "bf16", "parts": ["compile"], "error": "OutOfMemoryError", "device": "GPU"}
    by_eager = (130 / 33) / max(120 / 40, 125 / 36)
    for order in itertools.permutations([forge, comp, ro]):
        row = _collect(models, tmp_path, [failed, *order])
        assert "error" not in row  # the failed attempt is replaced by the part measured after it
        assert row["eager_ms"] == 130.0 and row["spread"]["eager"] == [129.0, 131.0]  # forge's own eager
        assert row["forge_x_compile_by_eager"] == pytest.approx(by_eager)
        assert row["forge_x_compile_by_ms"] == pytest.approx(36 / 33)
        assert row["forge_x_compile"] == pytest.approx(min(by_eager, 36 / 33))
        assert {k: v["eager_ms"] for k, v in row["by_part"].items()} == {"forge": 130.0, "compile": 120.0,
                                                                         "compile_ro": 125.0}


def test_a_mode_that_did_not_finish_is_compared_only_once_known(models: ModuleType, tmp_path: Path) -> None:
    forge, ro = _row(["forge"], 130.0, forge_ms=33.0), _row(["compile_ro"], 125.0, compile_ro_ms=36.0)
    assert "forge_x_compile" not in _collect(models, tmp_path, [forge, ro])  # the default mode not tried yet
    cut = {"model": "q", "dtype": "bf16", "parts": ["compile"], "device": "GPU", "compile_started": True,
           "compile_unfinished_s": 380.0, "limit_s": 385.0, "error": "time limit of 385 s reached"}
    row = _collect(models, tmp_path, [forge, cut, ro])
    assert row["compile_unfinished_s"] == 380.0 and "compile_ms" not in row
    assert row["forge_x_compile"] == pytest.approx(min((130 / 33) / (125 / 36), 36 / 33))


def test_parts_from_different_devices_are_refused(models: ModuleType, tmp_path: Path) -> None:
    other = dict(_row(["compile"], 120.0, compile_ms=40.0), device="another GPU")
    with pytest.raises(SystemExit, match="cannot join"):
        _collect(models, tmp_path, [_row(["forge"], 130.0, forge_ms=33.0), other])
