"""Turn a store location into a SQLAlchemy engine; SQLite gets WAL, a busy timeout and foreign keys."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

DEFAULT_PATH = Path("runs") / "forge.db"
BUSY_TIMEOUT_MS = 30_000
WRITE_OPTION = "forge_write"


def resolve_url(url: str | Path | None) -> str:
    """Return a SQLAlchemy URL: None means runs/forge.db, a plain path becomes sqlite:///PATH."""
    if url is None:
        url = DEFAULT_PATH
    text = str(url)
    if isinstance(url, Path) or "://" not in text:
        path = Path(text).expanduser()
        if text != ":memory:":
            path = path.resolve()
            path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    parsed = make_url(text)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not parsed.database.startswith("file:"):
            Path(parsed.database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return text


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
