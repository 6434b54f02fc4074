"""Parsing results: strict on status and field types, no daemon needed."""

import pytest

from roost_client import (
    Committed,
    Conflict,
    Invalid,
    Op,
    ProtocolError,
    Rejected,
    Unavailable,
    parse_result,
)


def test_each_documented_status_parses_to_its_type():
    c = parse_result(
        '{"request_key":"order-17","status":"committed","lsn":1,'
        '"ops":[{"op":"create","shard":"users","id":1},{"op":"create","shard":"orders","id":2}]}'
    )
    assert c == Committed("order-17", 1, [Op("create", "users", 1), Op("create", "orders", 2)])
    assert c.ids == [1, 2] and c.status == "committed"
    r = parse_result(b'{"request_key":"k","status":"rejected","op_index":1,"reason":"no id 17"}')
    assert r == Rejected("k", "no id 17", 1)
    assert parse_result({"request_key": "k", "status": "conflict", "lsn": 4, "reason": "x"}) == Conflict(
        "k", 4, "x"
    )
    assert parse_result({"request_key": None, "status": "invalid", "error": "e"}) == Invalid(None, "e")
    assert parse_result({"request_key": None, "status": "unavailable", "error": "e"}) == Unavailable(None, "e")
    # A field the contract adds later (a bulk line's "line") is no error.
    assert parse_result({"request_key": "k", "status": "committed", "line": 3, "lsn": 2, "ops": []}).lsn == 2


@pytest.mark.parametrize(
    "raw",
    [
        '{"request_key":"k","status":"exploded"}',
        '{"request_key":"k"}',
        '{"request_key":"k","status":"committed","ops":[]}',
        '{"request_key":"k","status":"committed","lsn":"1","ops":[]}',
        '{"request_key":"k","status":"committed","lsn":true,"ops":[]}',
        '{"request_key":"k","status":"committed","lsn":1,"ops":[{"op":"create","shard":"s"}]}',
        '{"status":"committed","lsn":1,"ops":[]}',
        '{"request_key":"k","status":"conflict","lsn":1}',
        "[1]",
        "not json",
    ],
)
def test_anything_else_is_a_protocol_error(raw):
    with pytest.raises(ProtocolError):
        parse_result(raw)
