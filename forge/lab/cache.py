"""The lab's cache on disk: each verified kernel's evaluation under a content key (device, task source,
candidate digest), and each entry's state at its default settings (what the gallery's index shows).

A kernel is built and judged once per content: a later build or run with the same task and candidate reads
its verdict here; a changed recipe or task gives a new key. Files are small JSON; a corrupt one counts as
missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def default_dir() -> Path:
    """$FORGE_LAB_CACHE, else ~/.cache/forge/lab."""
    env = os.environ.get("FORGE_LAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "forge" / "lab"


def content_key(device: str, source: str, digest: str) -> str:
    """The key of one kernel's verdict."""
    return hashlib.sha256(f"{device}\0{digest}\0{source}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Verdict:
    """A kernel's evaluation as the lab keeps it."""

    status: str
    message: str = ""
    us: float | None = None  # the kernel's median
    eager_us: float | None = None  # eager's, timed alongside
    build_s: float = 0.0
    device_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when it passed verification."""
        return self.status == "ok"


@dataclass(frozen=True)
class EntryState:
    """An entry at its default settings: forge's kernel (verified or not) or the vendor path, and why."""

    slug: str
    path: str  # "forge" | "vendor"
    why: str = ""
    status: str = ""  # the verdict's, for forge kernels
    us: float | None = None
    eager_us: float | None = None
    task: str = ""  # the task's key
    key: str = ""  # the verdict's content key (of the kernel the lab runs: the fastest that verified)
    knobs: str = ""  # that kernel's schedule
    tried: int = 0  # the policy's kernels judged to choose it


class Cache:
    """Verdicts and entry states under one folder, per device."""

    def __init__(self, root: Path, device: str) -> None:
        self.root = Path(root) / device.replace(":", "_")
        (self.root / "verdicts").mkdir(parents=True, exist_ok=True)
        (self.root / "entries").mkdir(parents=True, exist_ok=True)

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)  # a reader never sees half a file

    def verdict(self, key: str) -> Verdict | None:
        """The cached verdict of a content key, or None."""
        data = self._read(self.root / "verdicts" / f"{key}.json")
        try:
            return Verdict(**data) if data else None
        except TypeError:
            return None

    def put_verdict(self, key: str, v: Verdict) -> None:
        """Keep a verdict."""
        self._write(self.root / "verdicts" / f"{key}.json", asdict(v))

    def state(self, slug: str) -> EntryState | None:
        """An entry's state at its default settings, or None when it was never built."""
        data = self._read(self.root / "entries" / f"{slug}.json")
        try:
            return EntryState(**data) if data else None
        except TypeError:
            return None

    def put_state(self, s: EntryState) -> None:
        """Keep an entry's state."""
        self._write(self.root / "entries" / f"{s.slug}.json", asdict(s))
