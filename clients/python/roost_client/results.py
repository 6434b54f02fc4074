"""Typed results, parsed strictly from the result JSON (README, "Result").

A status this client does not know, a missing field or a field of the wrong type is a
`ProtocolError`, never a guess. Fields the contract adds later (it is only ever extended,
like a bulk line's `line`) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

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


_T = TypeVar("_T", int, str, List[Any])


def _get_optional(obj: Dict[str, Any], name: str, kind: Type[_T]) -> Optional[_T]:
    """`obj[name]` if it is a `kind`, None if it is absent or null."""
    if name not in obj or obj[name] is None:
        return None
    value = obj[name]
    # bool is an int in Python; the contract's integers never are booleans.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"result field {name!r} is not {kind.__name__}: {obj!r}")
    if isinstance(value, int) and value < 0:
        raise ProtocolError(f"result field {name!r} is negative: {obj!r}")
    return value


def _get(obj: Dict[str, Any], name: str, kind: Type[_T]) -> _T:
    """`obj[name]`, which must be a `kind`."""
    value = _get_optional(obj, name, kind)
    if value is None:
        raise ProtocolError(f"result without {name!r}: {obj!r}")
    return value


def _op(o: object) -> Op:
    if not isinstance(o, dict):
        raise ProtocolError(f"result op is not an object: {o!r}")
    return Op(_get(o, "op", str), _get(o, "shard", str), _get(o, "id", int))


def parse_result(raw: Union[str, bytes, Dict[str, Any]]) -> Result:
    """One result (a result file's JSON or one answer line) as its typed result."""
    obj: object
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
    if status in ("invalid", "unavailable"):
        key = _get_optional(obj, "request_key", str)
    else:
        key = _get(obj, "request_key", str)
    if status == "committed":
        ops = _get(obj, "ops", list)
        return Committed(key, _get(obj, "lsn", int), [_op(o) for o in ops])
    if status == "rejected":
        return Rejected(key, _get(obj, "reason", str), _get_optional(obj, "op_index", int))
    if status == "conflict":
        return Conflict(key, _get(obj, "lsn", int), _get(obj, "reason", str))
    if status == "invalid":
        return Invalid(key, _get(obj, "error", str))
    if status == "unavailable":
        return Unavailable(key, _get(obj, "error", str))
    raise ProtocolError(f"unknown result status {status!r}: {obj!r:.200}")
