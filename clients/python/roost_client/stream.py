"""The stream socket (README, "Streaming intake"): one batch per request line, one answer
line per request line, in request order, each as durable as a published result file.

Back-pressure: roost stops reading a connection that has its `stream_in_flight_max` batches
unanswered, so a client that only wrote would block in its write while its answers wait
unread. Here a writer thread sends, at most `window` batches ahead of the answers, while the
calling thread reads; neither waits on the other except through the window.

Resending: a batch answered `unavailable` (a standby while no node leads, claims from before
a restart still being finished, a stopping daemon) or left unanswered by a lost connection
may or may not have been claimed; sent again under the same key with the same content, it
gets its original answer if it was, and is run if it was not. So every call resends such
batches by default, on the same connection or a new one, after a pause of `backoff` seconds
doubled each round that answered nothing (at most `BACKOFF_MAX`; each pause taken between
half and all of that, at random), until `resend_horizon` seconds pass without any batch of
the call getting an answer other than `unavailable`. The default horizon, 30 s, is eight
times what a failover took at the default lease (3.6 s measured with `lease_ms = 3000`;
`daemon/tests/python_failover.rs` measures what this client waits), and longer than a
restart that replays its log.
"""

from __future__ import annotations

import errno as errnos
import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Generator, Iterable, Iterator, List, Optional, Tuple, Type, Union

from ._batch import Batch, as_line, encode
from .errors import ConnectionLost, NoAnswer, NotRunning, ProtocolError
from .results import Result, Unavailable, parse_result

log = logging.getLogger("roost_client")

# How long a call keeps resending without an answer other than `unavailable` (seconds).
RESEND_HORIZON = 30.0
# The first pause before a resend, doubled after each round that answered nothing.
BACKOFF = 0.1
# The longest pause between two resends, whatever `backoff` and the round say: a standby
# ready to forward to a new leader is used at most this long after (an `unavailable` answer
# costs the daemon little).
BACKOFF_MAX = 0.5


@dataclass(frozen=True)
class _Policy:
    resend: bool
    horizon: float
    retries: Optional[int]  # None: as many rounds as the horizon allows
    backoff: float


class Stream:
    """Batches over the stream socket at `socket_path` (`<data-dir>/stream.sock` by default).

    Without `connect`, each call opens its own connection and closes it when done. Used as a
    context manager (`with Stream(path) as s:`), or after `connect()`, the Stream keeps one
    connection open for every call until `close()`, reopening it when it is lost; a call
    made while that connection is busy (from another thread, or inside an `iter_many`
    loop) uses one of its own.

    `timeout`: the longest wait, in seconds, for the connection or for the next answer while
    batches wait (then `NoAnswer`). `resend_horizon` and `backoff`: the defaults of the
    resend policy (module docstring) for this Stream's calls.

    A Stream that never connected raises `NotRunning` at once when it cannot connect; one
    that has been connected takes a refused connection for a restart in progress and tries
    again within the horizon.
    """

    def __init__(
        self,
        socket_path: Union[str, "os.PathLike[str]"],
        timeout: float = 60.0,
        *,
        resend_horizon: float = RESEND_HORIZON,
        backoff: float = BACKOFF,
    ):
        self.path = os.fspath(socket_path)
        self.timeout = timeout
        self.resend_horizon = resend_horizon
        self.backoff = backoff
        # Guards the three fields below; held across no I/O but `connect`'s.
        self._state = threading.Lock()
        self._persistent = False  # connect() was called, close() not since
        self._busy = False  # a call holds the persistent connection
        self._idle: Optional[_Conn] = None  # the persistent connection between calls
        # Set once a connection was made, never unset: from then on a refused connection is
        # a restart in progress, retried within the horizon.
        self._ever_connected = False

    def connect(self) -> "Stream":
        """Opens the connection every later call uses (until `close`), and returns this
        Stream. `NotRunning` if it cannot be made."""
        with self._state:
            if self._idle is None and not self._busy:
                self._idle = self._open()
            self._persistent = True
        return self

    def close(self) -> None:
        """Closes the kept connection (a call using it closes it when done); later calls
        open their own again."""
        with self._state:
            self._persistent = False
            idle, self._idle = self._idle, None
        if idle is not None:
            idle.close()

    def __enter__(self) -> "Stream":
        return self.connect()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def submit(
        self,
        batch: Batch,
        *,
        resend_unavailable: bool = True,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        resend_horizon: Optional[float] = None,
    ) -> Result:
        """One batch, its answer, resent as `submit_many` says."""
        return self.submit_many([batch], 1, resend_unavailable, retries, backoff, resend_horizon)[0]

    def iter_many(
        self,
        batches: Iterable[Batch],
        window: int = 64,
        resend_unavailable: bool = True,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        resend_horizon: Optional[float] = None,
    ) -> Iterator[Result]:
        """Yields the answer of each batch, in input order, as soon as it and those before it
        are answered; at most `window` batches unanswered at a time. Resends as
        `submit_many` does (an answer is yielded once it is final)."""
        policy = self._policy(resend_unavailable, retries, backoff, resend_horizon)
        for _, r in self._run([as_line(b) for b in batches], window, policy):
            yield r

    def submit_many(
        self,
        batches: Iterable[Batch],
        window: int = 64,
        resend_unavailable: bool = True,
        retries: Optional[int] = None,
        backoff: Optional[float] = None,
        resend_horizon: Optional[float] = None,
    ) -> List[Result]:
        """The answers of all `batches`, in input order. Batches answered `unavailable` or
        left unanswered by a lost connection are sent again (same key, same content) until
        `resend_horizon` seconds (default: the Stream's, 30 s) pass without an answer other
        than `unavailable`, or `retries` rounds if given, pausing `backoff` seconds (default
        0.1) doubled each round that answered nothing, at most `BACKOFF_MAX`. A batch still
        `unavailable` then is returned so; if any is unanswered, `ConnectionLost` (its
        `results`: the answers, None where unanswered), or `NotRunning` if no connection
        could be made. `resend_unavailable=False`: one pass, no resend."""
        policy = self._policy(resend_unavailable, retries, backoff, resend_horizon)
        return [r for _, r in self._run([as_line(b) for b in batches], window, policy)]

    def _policy(
        self,
        resend: bool,
        retries: Optional[int],
        backoff: Optional[float],
        horizon: Optional[float],
    ) -> _Policy:
        return _Policy(
            resend,
            self.resend_horizon if horizon is None else horizon,
            retries,
            self.backoff if backoff is None else backoff,
        )

    def _run(self, lines: List[bytes], window: int, policy: _Policy) -> Iterator[Tuple[int, Result]]:
        """Every line's final answer, in input order, over as many rounds as the policy
        allows; each round sends the lines not answered for good yet."""
        if window < 1:
            raise ValueError("window must be at least 1")
        if not lines:
            return
        call = _Call(len(lines), policy)
        lease = self._lease()
        try:
            while True:
                conn = lease.conn if lease.conn is not None else self._reconnect(lease, call)
                if conn is not None:
                    call.connected = True
                    round_lines = [lines[i] for i in call.pending]
                    exchange = _exchange(conn, round_lines, window, self.timeout)
                    try:
                        for j, r in exchange:
                            call.take(call.pending[j], r)
                            yield from call.ready()
                    except ConnectionLost as e:
                        call.lost = e
                        lease.drop()
                    finally:
                        exchange.close()
                if not call.next_round():
                    break
            yield from call.finish(self.path)
        finally:
            self._release(lease)

    def _lease(self) -> "_Lease":
        """The kept connection if this Stream keeps one and no call uses it, else none yet
        (the call opens its own)."""
        with self._state:
            if self._persistent and not self._busy:
                self._busy = True
                conn, self._idle = self._idle, None
                return _Lease(conn, shared=True)
        return _Lease(None, shared=False)

    def _release(self, lease: "_Lease") -> None:
        conn = lease.conn
        if conn is not None and conn.broken:
            conn.close()
            conn = None
        with self._state:
            if lease.shared:
                self._busy = False
                if self._persistent and self._idle is None:
                    self._idle, conn = conn, None
        if conn is not None:
            conn.close()

    def _reconnect(self, lease: "_Lease", call: "_Call") -> Optional["_Conn"]:
        """A new connection for the lease, or None when it cannot be made now and this
        Stream has connected before (a restart: the round counts as lost). `NotRunning` if it
        never connected."""
        try:
            conn = self._open()
        except NotRunning as e:
            if not self._ever_connected:
                raise NotRunning(str(e), call.results, e.errno) from None
            call.lost = e
            return None
        lease.conn = conn
        return conn

    def _open(self) -> "_Conn":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError as e:
            s.close()
            raise NotRunning(_why_not(self.path, e), errno=e.errno) from None
        self._ever_connected = True
        return _Conn(s)


def _why_not(path: str, e: OSError) -> str:
    if e.errno in (errnos.ENOENT, errnos.ECONNREFUSED):
        return f"roost is not running at {path} (cannot connect: {e.strerror})"
    if e.errno in (errnos.EACCES, errnos.EPERM):
        return (
            f"cannot connect to {path}: {e.strerror} (this user may not use the socket:"
            " is it in the daemon's group?)"
        )
    return f"cannot connect to {path}: {e}"


class _Lease:
    """The connection one call uses; `shared`: the Stream's kept one, handed back at the end."""

    def __init__(self, conn: Optional["_Conn"], shared: bool):
        self.conn = conn
        self.shared = shared

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class _Call:
    """One call's state across its rounds: each batch's answer so far, which answers are
    final, how many have been handed out in input order, and the resend policy's clock."""

    def __init__(self, n: int, policy: _Policy):
        self.results: List[Optional[Result]] = [None] * n
        self.final = [False] * n
        self.handed = 0
        self.pending = list(range(n))  # the lines the current round sends
        self.policy = policy
        self.connected = False  # a connection was used during this call
        self.lost: Optional[BaseException] = None  # why the last round ended early
        self.rounds = 0
        self.pause = policy.backoff
        self.started = self.progress_at = time.monotonic()

    def take(self, i: int, r: Result) -> None:
        self.results[i] = r
        if not (self.policy.resend and isinstance(r, Unavailable)):
            self.final[i] = True
            self.progress_at = time.monotonic()
            self.pause = self.policy.backoff

    def ready(self) -> Iterator[Tuple[int, Result]]:
        """The answers now final that follow those handed out."""
        while self.handed < len(self.final) and self.final[self.handed]:
            r = self.results[self.handed]
            assert r is not None, "a final answer is an answer"
            yield self.handed, r
            self.handed += 1

    def next_round(self) -> bool:
        """After a round: pauses and says True when there are lines to send again and the
        policy allows another round; False when all are answered or it does not."""
        self.pending = [i for i in self.pending if not self.final[i]]
        if not self.pending:
            return False
        p = self.policy
        left = p.horizon - (time.monotonic() - self.progress_at)
        if not p.resend or left <= 0 or (p.retries is not None and self.rounds >= p.retries):
            return False
        log.debug("resending %d batches in %.2f s (%s)", len(self.pending), self.pause, self.lost)
        # Half the pause, plus up to half again at random: clients turned away together
        # do not all come back at the same moment.
        time.sleep(min(self.pause * (0.5 + random.random() / 2), left))
        self.pause = min(self.pause * 2, BACKOFF_MAX)
        self.rounds += 1
        self.lost = None
        return True

    def finish(self, path: str) -> Iterator[Tuple[int, Result]]:
        """Gives up on the lines still pending: an `unavailable` answer is final as it is;
        any line without an answer raises `ConnectionLost` (`NotRunning` if no connection
        was made during the call), after the answers before it are handed out."""
        for i in self.pending:
            if self.results[i] is not None:
                self.final[i] = True
        yield from self.ready()
        unanswered = sum(r is None for r in self.results)
        if not unanswered:
            return
        took = time.monotonic() - self.started
        why = self.lost or "no answer"
        if not self.connected:
            code = self.lost.errno if isinstance(self.lost, NotRunning) else None
            raise NotRunning(f"{why}; gave up after {took:.1f} s", self.results, code)
        raise ConnectionLost(
            f"{unanswered} batches unanswered after {self.rounds} resends over {took:.1f} s: {why}",
            self.results,
        )


class _Conn:
    """One open connection: its socket and the answer bytes read but not yet handed out.
    `broken`: an exchange on it did not finish (lines may be unanswered); never reused."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = _LineReader(sock)
        self.broken = False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _exchange(
    conn: _Conn, lines: List[bytes], window: int, timeout: float
) -> Generator[Tuple[int, Result], None, None]:
    """One round on one connection: sends `lines` (from a writer thread when there are more
    than one, at most `window` ahead of the answers) and yields (index, answer) in order
    as answers arrive. The connection is marked broken unless every line is answered."""
    keys = [encode(line.rstrip(b"\n"))[1] for line in lines]
    conn.broken = True
    w: Optional[_Writer] = None
    if len(lines) == 1:
        try:
            conn.sock.sendall(lines[0])
        except OSError as e:
            raise ConnectionLost(f"sending to the stream socket failed: {e}") from None
    else:
        w = _Writer(conn.sock, lines, window)
        w.thread.start()
    writer = w
    try:
        for i in range(len(lines)):
            line = conn.reader.next_line(
                timeout, pending=len(lines) - i, error=lambda: writer.error if writer else None
            )
            r = parse_result(line)
            if keys[i] is not None and r.request_key is not None and r.request_key != keys[i]:
                raise ProtocolError(f"answer {i + 1} is for {r.request_key!r}, expected {keys[i]!r}")
            if w is not None:
                w.answered(i + 1)
            yield i, r
        conn.broken = False
    finally:
        if w is not None:
            w.stop()
            if conn.broken:
                conn.close()  # wakes a writer blocked in sendall
            w.thread.join(timeout=timeout)


class _Writer:
    """Sends the request lines, waiting whenever `window` of them are unanswered."""

    def __init__(self, sock: socket.socket, lines: List[bytes], window: int):
        self.sock, self.lines, self.window = sock, lines, window
        self.cond = threading.Condition()
        self.done = 0  # answers read so far
        self.stopped = False
        self.error: Optional[BaseException] = None  # why sending stopped early
        self.thread = threading.Thread(target=self._run, name="roost-stream-writer", daemon=True)

    def answered(self, n: int) -> None:
        with self.cond:
            self.done = n
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def _run(self) -> None:
        try:
            for i, line in enumerate(self.lines):
                with self.cond:
                    while not self.stopped and i - self.done >= self.window:
                        self.cond.wait()
                    if self.stopped:
                        return
                self.sock.sendall(line)
        except OSError as e:  # the daemon went away; the reader sees the closed connection
            self.error = e


class _LineReader:
    """Answer lines from the socket, one at a time."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def next_line(self, timeout: float, pending: int, error: Callable[[], Optional[BaseException]]) -> bytes:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                return line
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise NoAnswer(f"no answer within {timeout} s while {pending} batches wait") from None
            except OSError as e:
                raise ConnectionLost(f"connection lost with {pending} batches unanswered: {e}") from None
            if not chunk:
                err = error()
                why = f" (sending failed: {err})" if err else ""
                raise ConnectionLost(f"connection closed with {pending} batches unanswered{why}")
            self.buf += chunk
