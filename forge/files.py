"""Files a command writes where the user says (--json, --html): the folder made when missing, and a path that
cannot be written is one line of bad input (UserError) naming it, not a traceback."""

from __future__ import annotations

import os
from pathlib import Path

from forge.errors import UserError


def writable(path: str | Path) -> Path:
    """`path` with its folder made; UserError when the folder cannot be made or written, or `path` is a folder.
    A long command checks its outputs with this before it starts, so that its end is not where they fail."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder on the way should be
        blocker = next((a for a in p.parents if a.exists()), p.parent)
        raise UserError(f"cannot write {path}: {blocker} is not a folder") from None
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    if p.is_dir():
        raise UserError(f"cannot write {path}: it is a folder")
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"cannot write {path}: permission denied")
    return p


def write(path: str | Path, text: str) -> None:
    """`text` into `path` (UTF-8; the folder made when missing); UserError when it cannot be written."""
    p = writable(path)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None


def folder(path: str | Path) -> Path:
    """`path` as a folder that exists and can be written (made when missing); UserError when it cannot be."""
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((a for a in (p, *p.parents) if a.exists() and not a.is_dir()), p)
        raise UserError(f"cannot write into {path}: {blocker} is not a folder") from None
    except OSError as e:
        raise UserError(f"cannot write into {path}: {e.strerror or e}") from None
    if not os.access(p, os.W_OK):
        raise UserError(f"cannot write into {path}: permission denied")
    return p
