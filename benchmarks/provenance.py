"""Where a benchmark row comes from: the commit, the date and the machine, stamped on every row written."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def commit() -> str:
    """$FORGE_COMMIT (a copy of the tree without .git, as on the device), else the checkout's commit (with
    +dirty when the tree has changes), or 'unknown'."""
    if os.environ.get("FORGE_COMMIT"):
        return os.environ["FORGE_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stamp(device: str) -> dict[str, Any]:
    """{"commit", "date", "device", "torch"}: the GPU's name, or the CPU's model and core count."""
    import torch

    if device.startswith("cuda"):
        machine = torch.cuda.get_device_name()
    else:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {"commit": commit(), "date": datetime.date.today().isoformat(), "device": machine,
            "torch": torch.__version__}
