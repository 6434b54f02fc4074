"""Delivery through the spool, exactly as `roost submit` does it (engine/src/spool/deliver.rs):
write `tmp/.NAME.PID.N`, flush and fsync it, rename it into `new/NAME`, fsync `new/`. The
daemon ignores dot-files and the rename is atomic, so it sees the whole file or none; once
`submit` has delivered, the file survives a power loss. With `wait`, the result file
`out/NAME` is polled for (bounded sleeps) and returned typed.

Once a result is read the batch is done, whatever follows: a result file this process may not
delete (`out/` is the daemon's, 2750 under the package: a client in `roost-submit` can read
it, not delete it) is left in place with a warning on the `roost_client` logger, never an
exception for a batch that committed.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
import uuid
from typing import Literal, Optional, Union, overload

from ._batch import Batch, encode
from .errors import NoAnswer, RoostError
from .results import Result, parse_result

log = logging.getLogger("roost_client")

_TMP_SEQ = itertools.count()
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(request_key: Optional[str]) -> str:
    """A spool name from a request key: characters outside [A-Za-z0-9._-] become `_`, no
    leading dot (dot-files are temporaries), at most 200 bytes, `.json` appended. No key: a
    random name."""
    if not request_key:
        return f"batch-{uuid.uuid4().hex}.json"
    stem = _UNSAFE.sub("_", request_key).lstrip(".")[:200] or "batch"
    return stem + ".json"


class Spool:
    """The spool directory of a roost (`<data-dir>/spool` unless `spool_dir` says otherwise)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], poll_max: float = 0.05):
        self.path = os.fspath(path)
        self.tmp = os.path.join(self.path, "tmp")
        self.new = os.path.join(self.path, "new")
        self.out = os.path.join(self.path, "out")
        self.failed = os.path.join(self.path, "failed")
        self.poll_max = poll_max

    @overload
    def submit(
        self,
        batch: Batch,
        wait: Literal[True] = ...,
        timeout: float = ...,
        name: Optional[str] = ...,
        keep_result: bool = ...,
    ) -> Result: ...

    @overload
    def submit(
        self,
        batch: Batch,
        wait: Literal[False],
        timeout: float = ...,
        name: Optional[str] = ...,
        keep_result: bool = ...,
    ) -> str: ...

    @overload
    def submit(
        self,
        batch: Batch,
        wait: bool,
        timeout: float = ...,
        name: Optional[str] = ...,
        keep_result: bool = ...,
    ) -> Union[Result, str]: ...

    def submit(
        self,
        batch: Batch,
        wait: bool = True,
        timeout: float = 60.0,
        name: Optional[str] = None,
        keep_result: bool = False,
    ) -> Union[Result, str]:
        """Delivers `batch` (a dict, or its JSON as str/bytes) under `name`, or a name made
        from its request key (`NAME-1.json`, ... if `new/`, `out/` or `failed/` has it, as
        `roost submit` picks). With `wait` (the default), waits up to `timeout` seconds for
        the result (else `NoAnswer`) and returns it typed (a `Result`), deleting `out/NAME`
        once read unless `keep_result`. With `wait=False`, returns the spool name used (a
        `str`), as `send` does; `wait(name)` gets the result later. Type checkers see which
        from the literal `wait` given."""
        spool_name = self.send(batch, name)
        if not wait:
            return spool_name
        return self.wait(spool_name, timeout, keep_result)

    def send(self, batch: Batch, name: Optional[str] = None) -> str:
        """Delivers `batch` as `submit` does without waiting, and returns the spool name
        used (pass it to `wait`)."""
        data, key = encode(batch)
        if name is not None and (not name or name.startswith(".") or "/" in name or "\0" in name):
            raise ValueError(f"{name!r} is not a spool name (one path component, no leading dot)")
        spool_name = self._free_name(name or safe_name(key))
        self.deliver(spool_name, data)
        return spool_name

    def deliver(self, name: str, data: bytes) -> None:
        """`tmp/.NAME.PID.N`, fsync, rename into `new/NAME`, fsync `new/`."""
        for d in (self.tmp, self.new):
            if not os.path.isdir(d):
                raise RoostError(f"spool directory {d} does not exist (is roost serving this spool?)")
        tmp = os.path.join(self.tmp, f".{name}.{os.getpid()}.{next(_TMP_SEQ)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, os.path.join(self.new, name))
        except BaseException:
            # A stray dot-file in tmp/ is harmless, but not worth leaving.
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dfd = os.open(self.new, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def wait(self, name: str, timeout: float = 60.0, keep_result: bool = False) -> Result:
        """The result of `new/NAME` once `out/NAME` appears (it appears whole: roost renames
        it into place), or `NoAnswer` after `timeout` seconds. `out/NAME` is deleted once
        read unless `keep_result`; if it cannot be (this user may read `out/`, not write it),
        it stays, a warning is logged, and the result is returned all the same: the batch
        is done, and a later `submit` picks a free name."""
        path = os.path.join(self.out, name)
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                with open(path, "rb") as f:
                    text = f.read()
                break
            except FileNotFoundError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAnswer(f"no result for {name} within {timeout} s") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, self.poll_max)
        result = parse_result(text)
        if not keep_result:
            _remove_result(path)
        return result

    def _free_name(self, base: str) -> str:
        """`base` unless new/, out/ or failed/ has it; then NAME-1, NAME-2, ... (`roost submit`)."""

        def taken(n: str) -> bool:
            return any(os.path.lexists(os.path.join(d, n)) for d in (self.new, self.out, self.failed))

        if not taken(base):
            return base
        stem, dot, ext = base.rpartition(".")
        if not stem:
            stem, dot, ext = base, "", ""
        for n in itertools.count(1):
            cand = f"{stem}-{n}{dot}{ext}"
            if not taken(cand):
                return cand
        raise AssertionError("unreachable")


def _remove_result(path: str) -> None:
    """Deletes a result file already read; a failure is logged, never raised (the batch it
    answers is done)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("result %s read but not deleted (%s); it stays in out/", path, e)
