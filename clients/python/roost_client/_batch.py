"""A batch as the bytes to send, and its request key when it has a readable one."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple, Union

# A batch: its JSON object as a dict, or its JSON text as str or bytes.
Batch = Union[Dict[str, Any], str, bytes]


def encode(batch: Batch) -> Tuple[bytes, Optional[str]]:
    """The batch's JSON bytes (a dict compact, str/bytes as given) and its request key, or
    None for bytes that are not a JSON object with a string key (roost judges those)."""
    if isinstance(batch, dict):
        key = batch.get("request_key")
        data = json.dumps(batch, separators=(",", ":"), ensure_ascii=False).encode()
        return data, key if isinstance(key, str) else None
    if isinstance(batch, str):
        data = batch.encode()
    elif isinstance(batch, (bytes, bytearray)):
        data = bytes(batch)
    else:
        raise TypeError(f"a batch is a dict, str or bytes, not {type(batch).__name__}")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data, None
    key = obj.get("request_key") if isinstance(obj, dict) else None
    return data, key if isinstance(key, str) else None


def as_line(batch: Batch) -> bytes:
    """The batch as one stream request line (ending in one newline). A batch whose JSON
    spans lines is made compact (its fingerprint is of the canonical batch, so the answer is
    the same); one that is not JSON and spans lines cannot be one line."""
    data, _ = encode(batch)
    data = data.rstrip(b"\r\n")
    if b"\n" in data:
        try:
            data = json.dumps(json.loads(data), separators=(",", ":"), ensure_ascii=False).encode()
        except (ValueError, UnicodeDecodeError):
            raise ValueError("a batch that is not JSON cannot span lines on the stream") from None
    return data + b"\n"
