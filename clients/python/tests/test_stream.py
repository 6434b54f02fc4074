"""The stream socket against a real `roost serve`, kill -9 included."""

import pytest

from roost_client import Committed, Conflict, ConnectionLost, Invalid, Rejected, Stream


def batch(key, shard="s", creates=1):
    return {
        "request_key": key,
        "ops": [{"op": "create", "shard": shard, "record": {"key": key, "i": i}} for i in range(creates)],
    }


# The daemon's default per-connection window (stream_in_flight_max) is 128.
@pytest.mark.parametrize("window", [16, 300])
def test_500_batches_answer_in_order(daemon, window):
    batches = [batch(f"w{window}-{i}", f"s{i % 4}", 1 + i % 3) for i in range(500)]
    results = Stream(daemon.stream_sock, timeout=60).submit_many(batches, window=window)
    assert len(results) == 500
    seen = set()
    for i, r in enumerate(results):
        assert isinstance(r, Committed), r
        assert r.request_key == f"w{window}-{i}"
        assert len(r.ids) == 1 + i % 3
        seen.update(r.ids)
    assert len(seen) == sum(len(r.ids) for r in results), "an id minted twice"


def test_one_at_a_time_duplicate_conflict_rejection_invalid(daemon):
    s = Stream(daemon.stream_sock, timeout=30)
    first = s.submit(batch("k"))
    assert isinstance(first, Committed)
    assert s.submit(batch("k")) == first
    c = s.submit(batch("k", creates=2))
    assert isinstance(c, Conflict) and c.lsn == first.lsn and c.reason, c
    r = s.submit({"request_key": "d", "ops": [{"op": "delete", "shard": "s", "id": 4242}]})
    assert isinstance(r, Rejected) and r.op_index == 0, r
    # Invalid lines mid-stream are answered in their place, and the rest goes on.
    out = s.submit_many([batch("a"), b"{nope", '{"request_key":"z","ops":[]}', batch("b")], window=4)
    assert [type(x) for x in out] == [Committed, Invalid, Invalid, Committed], out
    assert "stream line 2" in out[1].error


def test_kill_9_mid_stream_then_send_again(daemon):
    n = 2000
    batches = [batch(f"k9-{i}", f"s{i % 8}") for i in range(n)]
    answered = []
    with pytest.raises(ConnectionLost) as lost:
        for r in Stream(daemon.stream_sock, timeout=60).iter_many(batches, window=64):
            answered.append(r)
            if len(answered) == 300:
                daemon.kill()  # SIGKILL
    assert 300 <= len(answered) < n, len(answered)
    assert lost.value.results[: len(answered)] == answered
    assert all(isinstance(r, Committed) for r in answered)
    daemon.start()
    # Everything again, same keys, same content: the answered ones get their answers back,
    # the others are answered now (unavailable while old claims finish: sent again).
    again = Stream(daemon.stream_sock, timeout=60).submit_many(
        batches, window=128, resend_unavailable=True, retries=20, backoff=0.1
    )
    for i, r in enumerate(answered):
        assert again[i] == r, (i, r, again[i])
    assert all(isinstance(r, Committed) for r in again), [r for r in again if not isinstance(r, Committed)][:3]
    ids = [i for r in again for i in r.ids]
    assert len(set(ids)) == n == len(ids)
    on_shards = sum(len(daemon.roost("scan", f"s{s}").stdout.splitlines()) for s in range(8))
    assert on_shards == n


def test_no_daemon_is_connection_lost(tmp_path):
    with pytest.raises(ConnectionLost):
        Stream(tmp_path / "nothing.sock", timeout=5).submit(batch("x"))
    with pytest.raises(ConnectionLost):
        Stream(tmp_path / "nothing.sock", timeout=5).submit_many(
            [batch("x")], resend_unavailable=True, retries=2, backoff=0.01
        )


def test_resend_across_a_kill_9_and_restart(daemon):
    """submit_many(resend_unavailable=True) rides out a SIGKILL and a restart: the batches
    left unanswered (or answered unavailable) are sent again on new connections, and every
    batch ends committed exactly once."""
    import threading
    import time

    n = 1000
    batches = [batch(f"rs-{i}", f"r{i % 4}") for i in range(n)]
    box = {}

    def client():
        try:
            box["results"] = Stream(daemon.stream_sock, timeout=60).submit_many(
                batches, window=32, resend_unavailable=True, retries=40, backoff=0.05
            )
        except Exception as e:  # reported by the assertion below
            box["error"] = e

    t = threading.Thread(target=client, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while sum(len(daemon.roost("scan", f"r{s}").stdout.splitlines()) for s in range(4)) < 100:
        assert time.monotonic() < deadline, "the stream never got going"
        assert t.is_alive(), box
        time.sleep(0.02)
    daemon.kill()
    daemon.start()
    t.join(timeout=120)
    assert not t.is_alive(), "submit_many did not finish within 120 s"
    assert "error" not in box, box["error"]
    results = box["results"]
    assert [r.request_key for r in results] == [b["request_key"] for b in batches]
    assert all(isinstance(r, Committed) for r in results), [r for r in results if not isinstance(r, Committed)][:3]
    assert len({i for r in results for i in r.ids}) == n
    assert sum(len(daemon.roost("scan", f"r{s}").stdout.splitlines()) for s in range(4)) == n
    # And once more, nothing changes: the same answers.
    assert Stream(daemon.stream_sock, timeout=60).submit_many(batches, window=128) == results
