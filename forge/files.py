"""Files and folders a command writes where the user says (--json, --html, --out): checked before a long command
starts, without creating anything, and made when written (a missing folder too); a path that cannot be written is
one line of bad input (UserError) naming it, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

from forge.errors import UserError


def _reachable(path: Path, said: str | Path) -> None:
    """UserError unless the folder `path` exists and can be written, or can be made: its nearest existing
    ancestor (itself included) is a folder that can be written."""
    near = next((a for a in (path, *path.parents) if a.exists()), None)
    if near is not None and not near.is_dir():
        raise UserError(f"cannot write {said}: {near} is not a folder")
    if near is not None and not os.access(near, os.W_OK):
        raise UserError(f"cannot write {said}: permission denied in {near}")


def writable(path: str | Path) -> Path:
    """`path` as a file that can be written (its folder there or able to be made; nothing is made); else
    UserError. A long command checks its outputs with this before it starts."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"cannot write {path}: it is a folder")
    _reachable(p.parent.resolve(), path)
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"cannot write {path}: permission denied")
    return p


def folder(path: str | Path) -> Path:
    """`path` as a folder that exists and can be written, or can be made (nothing is made); else UserError."""
    p = Path(path).expanduser()
    _reachable(p.resolve(), path)
    return p


def write(path: str | Path, text: str) -> None:
    """`text` into `path` (UTF-8; the folder made when missing); UserError when it cannot be written."""
    p = writable(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
