"""The errors a client raises; every one is a `RoostError`."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence

if TYPE_CHECKING:  # results imports this module
    from .results import Result


class RoostError(Exception):
    """The base of every error this package raises."""


class ProtocolError(RoostError):
    """An answer that is not the result JSON README's "Public contract" documents."""


class NoAnswer(RoostError, TimeoutError):
    """No answer within the timeout (a result file that did not appear, a stream gone quiet)."""


class ConnectionLost(RoostError):
    """The stream connection closed with batches unanswered, and the resend horizon (or
    `retries`) ran out before they were answered on a new one.

    `results` holds one entry per batch sent, in input order: its result, or None for one
    without an answer. An unanswered batch may or may not have been claimed: send it again
    under the same key (the same content gets the original answer if it was).
    """

    def __init__(self, message: str, results: Optional[Sequence[Optional[Result]]] = None):
        super().__init__(message)
        self.results: List[Optional[Result]] = list(results) if results is not None else []


class NotRunning(ConnectionLost):
    """No connection to the stream socket could be made for the call, so none of its batches
    was sent: the socket is missing or refuses connections (roost is not running there), or
    the system refused this process (`errno` says which: EACCES is a user not in the group
    that may use the socket).

    A `Stream` that never connected raises it at its first attempt; one that has been
    connected takes a refused connection for a restart in progress and raises it only once
    the resend horizon passed without a connection. It is a `ConnectionLost` (every `results`
    entry None) so that code written before it existed, which caught `ConnectionLost` for
    both, still does.
    """

    def __init__(
        self,
        message: str,
        results: Optional[Sequence[Optional[Result]]] = None,
        errno: Optional[int] = None,
    ):
        super().__init__(message, results)
        self.errno = errno
