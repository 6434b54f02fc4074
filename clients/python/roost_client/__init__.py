"""A client for roost, standard library only.

`Spool` delivers a batch the way `roost submit` does (tmp/, fsync, rename into new/, fsync
new/) and waits for its result file; `Stream` keeps batches in flight on one connection to
the stream socket (kept open across calls when used as a context manager) and resends those
answered `unavailable` or left unanswered until its resend horizon (30 s) passes. Both return
the typed results of `roost_client.results`. The package is typed (`py.typed`).
"""

from ._batch import Batch
from .errors import ConnectionLost, NoAnswer, NotRunning, ProtocolError, RoostError
from .results import (
    Committed,
    Conflict,
    Invalid,
    Op,
    Rejected,
    Result,
    Unavailable,
    parse_result,
)
from .spool import Spool
from .stream import Stream

__all__ = [
    "Batch",
    "Committed",
    "Conflict",
    "ConnectionLost",
    "Invalid",
    "NoAnswer",
    "NotRunning",
    "Op",
    "ProtocolError",
    "Rejected",
    "Result",
    "RoostError",
    "Spool",
    "Stream",
    "Unavailable",
    "parse_result",
]
