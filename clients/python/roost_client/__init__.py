"""A client for roost, standard library only.

`Spool` delivers a batch the way `roost submit` does (tmp/, fsync, rename into new/, fsync
new/) and waits for its result file; `Stream` keeps batches in flight on one connection to
the stream socket. Both return the typed results of `roost_client.results`.
"""

from .errors import ConnectionLost, NoAnswer, ProtocolError, RoostError
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
    "Committed",
    "Conflict",
    "ConnectionLost",
    "Invalid",
    "NoAnswer",
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
