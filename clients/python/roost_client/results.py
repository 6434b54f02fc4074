"""Typed results, parsed strictly from the result JSON (README, "Result").

A status this client does not know, a missing field or a field of the wrong type is a
`ProtocolError`, never a guess. Fields the contract adds later (it is only ever extended,
like a bulk line's `line`) are ignored.
"""

import json
from dataclasses import dataclass, field
from typing import List, Optional, Union

from .errors import ProtocolError


@dataclass(frozen=True)
class Op:
    """One committed op: what it did, on which shard, to which id."""

    op: str
    shard: str
    id: int


@dataclass(frozen=True)
class Result:
    """The base of every result; `request_key` is None only for an answer without one."""

    request_key: Optional[str]

    @property
    def status(self) -> str:
        return _STATUS_OF[type(self)]


@dataclass(frozen=True)
class Committed(Result):
    lsn: int
    ops: List[Op] = field(default_factory=list)

    @property
    def ids(self) -> List[int]:
        return [o.id for o in self.ops]


@dataclass(frozen=True)
class Rejected(Result):
    reason: str
    op_index: Optional[int] = None


@dataclass(frozen=True)
class Conflict(Result):
    lsn: int
    reason: str


@dataclass(frozen=True)
class Invalid(Result):
    error: str


@dataclass(frozen=True)
class Unavailable(Result):
    """Not taken now (paused intake, a standby, a stopping daemon): send it again later
    under the same key."""

    error: str


_STATUS_OF = {
    Committed: "committed",
    Rejected: "rejected",
    Conflict: "conflict",
    Invalid: "invalid",
    Unavailable: "unavailable",
}


def _get(obj: dict, name: str, kind, optional: bool = False):
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise ProtocolError(f"result without {name!r}: {obj!r}")
    value = obj[name]
    # bool is an int in Python; the contract's integers never are booleans.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"result field {name!r} is not {kind.__name__}: {obj!r}")
    if kind is int and value < 0:
        raise ProtocolError(f"result field {name!r} is negative: {obj!r}")
    return value


def _op(o) -> Op:
    if not isinstance(o, dict):
        raise ProtocolError(f"result op is not an object: {o!r}")
    return Op(_get(o, "op", str), _get(o, "shard", str), _get(o, "id", int))


def parse_result(raw: Union[str, bytes, dict]) -> Result:
    """One result (a result file's JSON or one answer line) as its typed result."""
    if isinstance(raw, dict):
        obj = raw
    else:
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"result is not JSON ({e}): {raw!r:.200}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"result is not a JSON object: {obj!r:.200}")
    status = obj.get("status")
    # Only invalid and unavailable answers may lack a key (a line that could not be read,
    # a connection refused).
    key = _get(obj, "request_key", str, optional=status in ("invalid", "unavailable"))
    if status == "committed":
        ops = _get(obj, "ops", list)
        return Committed(key, _get(obj, "lsn", int), [_op(o) for o in ops])
    if status == "rejected":
        return Rejected(key, _get(obj, "reason", str), _get(obj, "op_index", int, optional=True))
    if status == "conflict":
        return Conflict(key, _get(obj, "lsn", int), _get(obj, "reason", str))
    if status == "invalid":
        return Invalid(key, _get(obj, "error", str))
    if status == "unavailable":
        return Unavailable(key, _get(obj, "error", str))
    raise ProtocolError(f"unknown result status {status!r}: {obj!r:.200}")
