"""forge's run store: the one place that talks to the database (SQLite by default, via SQLAlchemy).

Everything it hands out is a small frozen dataclass, so no other module sees SQLAlchemy.
"""

from .base import new_run_id
from .core import Store
from .engine import DEFAULT_PATH, ENV, describe, locate, resolve_url, sqlite_file
from .records import (
    BACKENDS,
    RUN_STATES,
    CandidateRecord,
    EvaluationRecord,
    LLMCallRecord,
    RunCost,
    RunRecord,
    TaskRecord,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_PATH",
    "ENV",
    "RUN_STATES",
    "CandidateRecord",
    "EvaluationRecord",
    "LLMCallRecord",
    "RunCost",
    "RunRecord",
    "Store",
    "TaskRecord",
    "describe",
    "locate",
    "new_run_id",
    "resolve_url",
    "sqlite_file",
]
