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


def test_a_result_this_user_may_not_delete_is_returned_not_raised(daemon, monkeypatch, caplog):
    """A client that may read `out/` but not write it (a `roost-submit` member under the
    package: `out/` is 2750) gets its committed result, with a warning, never the
    `PermissionError` of deleting it; the next submit under that name picks a free one and
    gets the original answer. The refusal is the kernel's EACCES, made here for any user."""
    import logging

    import roost_client.spool

    real_unlink = os.unlink
    refused = []

    def unlink(path, *args, **kwargs):
        if os.path.dirname(os.fspath(path)) == str(daemon.spool / "out"):
            refused.append(path)
            raise PermissionError(13, "Permission denied", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(roost_client.spool.os, "unlink", unlink)
    spool = Spool(daemon.spool)
    with caplog.at_level(logging.WARNING, logger="roost_client"):
        first = spool.submit(order("no-delete"), timeout=30)
    assert isinstance(first, Committed), first
    assert refused and os.path.exists(os.path.join(spool.out, "no-delete.json"))
    assert "read but not deleted" in caplog.text and "Permission denied" in caplog.text
    again = spool.submit(order("no-delete"), timeout=30)
    assert again == first
    assert os.path.exists(os.path.join(spool.out, "no-delete-1.json"))


def test_send_returns_the_name_and_submit_wait_false_still_does(daemon):
    """`send` is `submit(wait=False)` with one return type (the spool name)."""
    spool = Spool(daemon.spool)
    name = spool.send(order("sent"))
    assert name == "sent.json"
    r = spool.wait(name, timeout=30)
    assert isinstance(r, Committed) and r.request_key == "sent"
    name2 = spool.submit(order("sent-2"), wait=False)
    assert isinstance(name2, str) and isinstance(spool.wait(name2, timeout=30), Committed)
