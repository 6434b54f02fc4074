"""The errors a client raises; every one is a `RoostError`."""

from typing import List, Optional


class RoostError(Exception):
    """The base of every error this package raises."""


class ProtocolError(RoostError):
    """An answer that is not the result JSON README's "Public contract" documents."""


class NoAnswer(RoostError, TimeoutError):
    """No answer within the timeout (a result file that did not appear, a stream gone quiet)."""


class ConnectionLost(RoostError):
    """The stream connection closed (or could not be opened) with batches unanswered.

    `results` holds one entry per batch sent, in input order: its result, or None for one
    without an answer. An unanswered batch may or may not have been claimed: send it again
    under the same key (the same content gets the original answer if it was).
    """

    def __init__(self, message: str, results: Optional[List[object]] = None):
        super().__init__(message)
        self.results = results if results is not None else []
