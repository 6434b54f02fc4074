"""Spool delivery against a real `roost serve`."""

import os

import pytest

from roost_client import Committed, Invalid, NoAnswer, Rejected, Spool


def order(key):
    return {
        "request_key": key,
        "ops": [
            {"op": "create", "shard": "users", "record": {"name": "ada"}},
            {"op": "create", "shard": "orders", "record": {"user": "ada"}},
        ],
    }


def test_committed_with_ids_and_the_same_key_gets_the_same_ids(daemon):
    spool = Spool(daemon.spool)
    first = spool.submit(order("order-17"), timeout=30)
    assert isinstance(first, Committed), first
    assert first.request_key == "order-17" and len(first.ids) == 2
    assert [(o.op, o.shard) for o in first.ops] == [("create", "users"), ("create", "orders")]
    # The result file was read and removed; nothing is left in tmp/.
    assert os.listdir(spool.out) == [] and os.listdir(spool.tmp) == []
    # Same key, same content (as JSON text this time, other key order): the original answer.
    again = spool.submit(
        '{"ops":[{"op":"create","shard":"users","record":{"name":"ada"}},'
        '{"op":"create","shard":"orders","record":{"user":"ada"}}],"request_key":"order-17"}',
        timeout=30,
    )
    assert again == first
    assert len(daemon.roost("scan", "users").stdout.splitlines()) == 1


def test_a_delete_of_a_missing_id_is_rejected(daemon):
    r = Spool(daemon.spool).submit(
        {"request_key": "del-1", "ops": [{"op": "delete", "shard": "users", "id": 999}]}, timeout=30
    )
    assert isinstance(r, Rejected), r
    assert r.request_key == "del-1" and r.op_index == 0 and r.reason


def test_an_invalid_file_is_invalid(daemon):
    spool = Spool(daemon.spool)
    r = spool.submit(b'{"request_key":"empty","ops":[]}', timeout=30)
    assert isinstance(r, Invalid) and r.error, r
    r = spool.submit(b"not json at all", name="garbage.json", timeout=30)
    assert isinstance(r, Invalid) and "JSON" in r.error, r
    assert os.path.exists(os.path.join(spool.failed, "garbage.json"))


def test_names_are_made_safe_and_never_reused_while_taken(daemon):
    spool = Spool(daemon.spool)
    name = spool.submit(order("../we ird/key"), wait=False)
    assert name == ".._we_ird_key.json".lstrip(".")
    second = spool.submit(order("../we ird/key"), wait=False, keep_result=True)
    assert second in (name, "_we_ird_key-1.json")
    assert isinstance(spool.wait(name, timeout=30, keep_result=True), Committed)
    assert isinstance(spool.wait(second, timeout=30), Committed)
    # out/NAME is kept: a third delivery takes a free name.
    assert spool.submit(order("../we ird/key"), wait=False) != name


def test_waiting_is_bounded():
    # No daemon: the file is delivered, no result comes.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for sub in ("tmp", "new", "out", "failed"):
            os.mkdir(os.path.join(d, sub))
        with pytest.raises(NoAnswer):
            Spool(d).submit(order("k"), timeout=0.2)
        assert os.listdir(os.path.join(d, "new")) == ["k.json"]
