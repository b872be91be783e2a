"""Plumbing under the Store: sessions, record conversion, field checks and run ids."""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session

from .engine import describe, make_engines, resolve_url, sqlite_file, unavailable
from .models import Base, utcnow
from .records import RUN_STATES

log = logging.getLogger(__name__)

R = TypeVar("R")
S = TypeVar("S", bound="StoreBase")
_FROZEN = {"id", "run_id", "task_id", "candidate_id", "created_at"}


def new_run_id(now: datetime | None = None) -> str:
    """Return a fresh short run id such as r20261129-ab12cd."""
    now = now or utcnow()
    return f"r{now:%Y%m%d}-{secrets.token_hex(3)}"


def _record(cls: type[R], row: Any) -> R:
    """Copy an ORM row into the frozen dataclass cls (datetimes made UTC-aware)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(row, field.name)
        if isinstance(value, datetime) and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        values[field.name] = value
    return cls(**values)


def _apply(row: Any, kind: str, fields: dict[str, Any]) -> None:
    """Set fields on row, refusing unknown columns and identity columns."""
    columns = set(type(row).__table__.columns.keys())
    for name, value in fields.items():
        if name not in columns:
            raise TypeError(f"{kind} has no field {name!r}")
        if name in _FROZEN:
            raise TypeError(f"{kind} field {name!r} cannot be changed")
        setattr(row, name, value)


def _check_run_state(state: str) -> None:
    """Raise ValueError unless state is a known run state."""
    if state not in RUN_STATES:
        raise ValueError(f"run state must be one of {RUN_STATES}, not {state!r}")


class StoreBase:
    """Engines, sessions and lookups shared by every Store method."""

    def __init__(self, url: str | Path | None = None) -> None:
        """Open (creating if needed) the store at url; None means $FORGE_DB, else SQLite at runs/forge.db.
        StoreUnavailable (one line, no password) when it cannot be opened."""
        self.url = resolve_url(url)
        self.file: Path | None = sqlite_file(self.url)  # the SQLite file (absolute), None for another database
        self.where = describe(self.url)  # for messages: that file, or the URL without its password
        try:  # the driver imported, the database reached and its tables made
            self._reader, self._writer = make_engines(self.url)
            with self._writer.begin() as conn:
                Base.metadata.create_all(conn)
        except (ImportError, ArgumentError, DBAPIError) as e:  # not a bug of forge's: a store it cannot open
            log.debug("opening the store failed", exc_info=True)
            raise unavailable(url, e) from e
        log.debug("opened store %s", self._reader.url.render_as_string(hide_password=True))

    # -- plumbing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Release every pooled connection."""
        self._reader.dispose()

    def __enter__(self: S) -> S:
        """Use the store as a context manager that closes on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        """Show where the store lives."""
        return f"{type(self).__name__}({self._reader.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """Yield a session in one write transaction, committed when the block ends."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """Yield a session for reading."""
        with Session(self._reader, expire_on_commit=False) as session:
            yield session

    @staticmethod
    def _get(session: Session, model: type[Any], key: Any, kind: str) -> Any:
        """Load one row by primary key or raise KeyError naming what was missing."""
        row = session.get(model, key)
        if row is None:
            raise KeyError(f"unknown {kind} id {key!r}")
        return row
