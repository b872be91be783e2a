"""Turn a store location into a SQLAlchemy engine; SQLite gets WAL, a busy timeout and foreign keys."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from forge.errors import StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_PATH = Path("runs") / "forge.db"
ENV = "FORGE_DB"  # the store's URL or SQLite path when no --db (db=) is given
BUSY_TIMEOUT_MS = 30_000
WRITE_OPTION = "forge_write"


def locate(url: str | Path | None) -> str | Path:
    """The store asked for: `url` if given, else $FORGE_DB if set, else runs/forge.db (the same for every command)."""
    if url is not None and str(url) != "":
        return url
    return os.environ.get(ENV) or DEFAULT_PATH


def resolve_url(url: str | Path | None, create: bool = True) -> str:
    """Return a SQLAlchemy URL for `locate(url)`: a plain path becomes sqlite:///ABSOLUTE-PATH.

    `create`: make the SQLite file's folder (a reader passes False and checks `sqlite_file` exists instead).
    StoreUnavailable for a URL that does not parse or a folder that cannot be made.
    """
    try:
        return _resolved(locate(url), create)
    except (OSError, ValueError, ArgumentError) as e:
        raise unavailable(url, e) from e


def _resolved(url: str | Path, create: bool) -> str:
    text = str(url)
    if isinstance(url, Path) or "://" not in text:
        if text == ":memory:":
            return "sqlite:///:memory:"
        path = Path(text).expanduser().resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    file = sqlite_file(text)
    if create and file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
    return text


def sqlite_file(url: str) -> Path | None:
    """The absolute path of the SQLite file a resolved URL names; None for another database or one in memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.database.startswith("file:"):  # a URI filename: file:PATH?options
        return Path(parsed.database[5:].split("?", 1)[0]).expanduser().resolve()
    return Path(parsed.database).expanduser().resolve()


def describe(url: str) -> str:
    """Where a resolved store lives, for messages: the SQLite file's absolute path, or the URL without password."""
    file = sqlite_file(url)
    return str(file) if file is not None else make_url(url).render_as_string(hide_password=True)


def masked(text: str) -> str:
    """`text` with the password of any URL in it masked (up to the last @ before the host's end: an unescaped @
    in a password does not show the rest of it)."""
    return re.sub(r"(://[^:/@\s]*:)[^/\s]*@", r"\1***@", text)


def why(e: BaseException) -> str:
    """The first line of what went wrong opening a store: the database driver's own words where it has them."""
    if isinstance(e, DBAPIError) and e.orig is not None:
        e = e.orig
    if isinstance(e, ImportError) and e.name:
        return f"its driver is not installed (no module {e.name})"
    if isinstance(e, (FileExistsError, NotADirectoryError)) and e.filename:  # a file where a folder should be
        return f"{e.filename} is not a folder"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return masked((str(e).strip().splitlines() or [type(e).__name__])[0][:300])


def unavailable(url: str | Path | None, e: BaseException) -> StoreUnavailable:
    """The error for a store that could not be opened: where it was asked for (a path as given, a URL with its
    password masked) and why."""
    where, reason = str(locate(url)), why(e)
    if "://" not in where:
        return StoreUnavailable(f"cannot open the run store {Path(where).expanduser()}: {reason}")
    try:
        parsed = make_url(where)
        where = describe(where)
        if "@" in (parsed.host or ""):  # the driver's words would name the rest of the password as the host
            reason = "an @ in its password must be written %40"
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot read: shown as given
        pass
    return StoreUnavailable(f"cannot open the run store {masked(where)}: {reason}")


def _sqlite_connect(dbapi_connection: Any, connection_record: Any) -> None:
    """Set the pragmas that let several processes share one SQLite file safely."""
    # Take BEGIN away from the sqlite3 module; _sqlite_begin emits it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_begin(conn: Any) -> None:
    """Open a transaction: IMMEDIATE for writers (take the write lock up front), else DEFERRED."""
    if conn.get_execution_options().get(WRITE_OPTION):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        conn.exec_driver_sql("BEGIN")


def make_engines(url: str) -> tuple[Engine, Engine]:
    """Create the (reader, writer) engine pair for url; they share one connection pool."""
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    writer = engine.execution_options(**{WRITE_OPTION: True})
    log.debug("store engine for %s", engine.url.render_as_string(hide_password=True))
    return engine, writer
