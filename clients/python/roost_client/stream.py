"""The stream socket (README, "Streaming intake"): one batch per request line, one answer
line per request line, in request order, each as durable as a published result file.

Back-pressure: roost stops reading a connection that has its `stream_in_flight_max` batches
unanswered, so a client that only wrote would block in its write while its answers wait
unread. Here a writer thread sends, at most `window` batches ahead of the answers, while the
calling thread reads; neither waits on the other except through the window.
"""

import os
import socket
import threading
import time
from typing import Iterable, Iterator, List, Optional, Tuple, Union

from ._batch import Batch, as_line, encode
from .errors import ConnectionLost, NoAnswer, ProtocolError
from .results import Result, Unavailable, parse_result

# The longest pause between two resends, whatever `backoff` and the attempt number say.
BACKOFF_MAX = 5.0


class Stream:
    """Batches over the stream socket at `socket_path` (`<data-dir>/stream.sock` by default).
    Each call opens its own connection. `timeout`: the longest wait, in seconds, for the
    connection or for the next answer while batches wait (then `NoAnswer`)."""

    def __init__(self, socket_path: Union[str, os.PathLike], timeout: float = 60.0):
        self.path = os.fspath(socket_path)
        self.timeout = timeout

    def submit(self, batch: Batch) -> Result:
        """One batch, its answer. `ConnectionLost` if the connection closed unanswered."""
        return self.submit_many([batch], window=1)[0]

    def iter_many(self, batches: Iterable[Batch], window: int = 64) -> Iterator[Result]:
        """Yields the answer of each batch, in input order, as it arrives; at most `window`
        batches unanswered at a time. Raises `ConnectionLost` (its `results`: those answered)
        if the connection closes early."""
        lines = [as_line(b) for b in batches]
        answered: List[Optional[Result]] = []
        try:
            for _, r in self._exchange(lines, window):
                answered.append(r)
                yield r
        except ConnectionLost as e:
            raise ConnectionLost(str(e), answered + [None] * (len(lines) - len(answered))) from None

    def submit_many(
        self,
        batches: Iterable[Batch],
        window: int = 64,
        resend_unavailable: bool = False,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> List[Result]:
        """The answers of all `batches`, in input order. With `resend_unavailable`, the
        batches answered `unavailable` or left unanswered by a closed connection are sent
        again (same key, same content) on a new connection, up to `retries` more times,
        sleeping `backoff` seconds doubled each time (at most `BACKOFF_MAX`); a batch still
        `unavailable` after that is returned so. `ConnectionLost` (with `results`, None
        where unanswered) if any batch is left without an answer."""
        lines = [as_line(b) for b in batches]
        results: List[Optional[Result]] = [None] * len(lines)
        pending = list(range(len(lines)))
        attempt = 0
        while True:
            lost: Optional[ConnectionLost] = None
            try:
                for j, r in self._exchange([lines[i] for i in pending], window):
                    results[pending[j]] = r
            except ConnectionLost as e:
                lost = e
            if resend_unavailable:
                pending = [
                    i for i in pending if results[i] is None or isinstance(results[i], Unavailable)
                ]
            elif lost is None:
                pending = []
            if not pending or attempt >= retries or not resend_unavailable:
                unanswered = sum(r is None for r in results)
                if unanswered:
                    why = lost or "no answer"
                    raise ConnectionLost(f"{unanswered} batches unanswered: {why}", list(results))
                return list(results)  # type: ignore[arg-type]
            time.sleep(min(backoff * 2**attempt, BACKOFF_MAX))
            attempt += 1

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError as e:
            s.close()
            raise ConnectionLost(f"cannot connect to {self.path}: {e}") from None
        return s

    def _exchange(self, lines: List[bytes], window: int) -> Iterator[Tuple[int, Result]]:
        """One connection: sends `lines` from a writer thread, at most `window` ahead of the
        answers, and yields (index, answer) in order as answers arrive."""
        if window < 1:
            raise ValueError("window must be at least 1")
        if not lines:
            return
        sock = self._connect()
        keys = [encode(line.rstrip(b"\n"))[1] for line in lines]
        w = _Writer(sock, lines, window)
        w.thread.start()
        try:
            reader = _LineReader(sock)
            for i in range(len(lines)):
                line = reader.next_line(self.timeout, pending=len(lines) - i, error=lambda: w.error)
                r = parse_result(line)
                if keys[i] is not None and r.request_key is not None and r.request_key != keys[i]:
                    raise ProtocolError(f"answer {i + 1} is for {r.request_key!r}, expected {keys[i]!r}")
                w.answered(i + 1)
                yield i, r
        finally:
            w.stop()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            w.thread.join(timeout=self.timeout)


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

    def next_line(self, timeout: float, pending: int, error) -> bytes:
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
                why = f" (sending failed: {error()})" if error() else ""
                raise ConnectionLost(f"connection closed with {pending} batches unanswered{why}")
            self.buf += chunk
