"""The stream socket against a real `roost serve`, kill -9 included."""

import errno
import threading
import time

import pytest

from roost_client import Committed, Conflict, ConnectionLost, Invalid, NotRunning, Rejected, RoostError, Stream


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
        # No resend (the default rides out a kill, test_defaults_ride_out_a_kill_9_and_restart):
        # the connection's loss is seen here.
        stream = Stream(daemon.stream_sock, timeout=60)
        for r in stream.iter_many(batches, window=64, resend_unavailable=False):
            answered.append(r)
            if len(answered) == 300:
                daemon.kill()  # SIGKILL
    assert 300 <= len(answered) < n, len(answered)
    assert not isinstance(lost.value, NotRunning), "lost mid-flight is not 'not running'"
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


def test_no_daemon_is_not_running_at_once(tmp_path):
    """A daemon that is not running is `NotRunning` (still a `ConnectionLost` and a
    `RoostError`, as code written before it expects), at the first attempt: the resend
    horizon is for a daemon that was reached and went away, not for one never reached."""
    for call in (
        lambda s: s.submit(batch("x")),
        lambda s: s.submit_many([batch("x"), batch("y")]),
        lambda s: list(s.iter_many([batch("x")])),
        lambda s: s.connect(),
    ):
        t0 = time.monotonic()
        with pytest.raises(NotRunning) as e:
            call(Stream(tmp_path / "nothing.sock", timeout=5))
        assert time.monotonic() - t0 < 1.0, "waited for a daemon that was never reached"
        assert isinstance(e.value, ConnectionLost) and isinstance(e.value, RoostError)
        assert e.value.errno == errno.ENOENT and "not running" in str(e.value), e.value
        assert all(r is None for r in e.value.results)
    # A stale socket file (a killed daemon's) refuses: the same.
    import socket

    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    with pytest.raises(NotRunning) as e:
        Stream(stale, timeout=5).submit(batch("x"))
    assert e.value.errno == errno.ECONNREFUSED, e.value


def test_a_stream_used_as_a_context_manager_keeps_one_connection(daemon):
    """`with Stream(...) as s:` opens one connection at the start, every call uses it, and
    the end closes it; a Stream without `with` opens one per call, as it always did."""
    before = daemon.status()["stream"]["connections_total"]
    def open_connections(n):
        deadline = time.monotonic() + 10
        while daemon.status()["stream"]["connections"] != n:
            assert time.monotonic() < deadline, f"not {n} connections open"
            time.sleep(0.05)

    with Stream(daemon.stream_sock, timeout=30) as s:
        open_connections(1)  # opened by `with`, before any call
        firsts = [s.submit(batch(f"cm-{i}")) for i in range(20)]
        assert all(isinstance(r, Committed) for r in firsts)
        assert s.submit_many([batch(f"cm-{i}") for i in range(20)], window=8) == firsts
        assert list(s.iter_many([batch(f"cm-{i}") for i in range(20)], window=3)) == firsts
        # A call inside an iter_many loop cannot share the busy connection: it opens its own.
        for r in s.iter_many([batch("cm-outer")]):
            assert s.submit(batch("cm-inner")).request_key == "cm-inner"
    assert daemon.status()["stream"]["connections_total"] - before == 2
    open_connections(0)  # closed at the end of `with`
    plain = Stream(daemon.stream_sock, timeout=30)
    assert plain.submit(batch("cm-0")) == firsts[0] and plain.submit(batch("cm-1")) == firsts[1]
    assert daemon.status()["stream"]["connections_total"] - before == 4


def test_a_kept_connection_rides_out_a_restart_between_calls(daemon):
    """The daemon restarts (kill -9) while a `with Stream` holds an idle connection: the next
    call, with the default settings, finds the connection dead, reconnects once the daemon
    serves again and gets its answer; no error."""
    with Stream(daemon.stream_sock, timeout=30) as s:
        first = s.submit(batch("rs-a"))
        daemon.kill()
        box = {}
        t = threading.Thread(target=lambda: box.update(r=s.submit(batch("rs-b"))), daemon=True)
        t.start()
        time.sleep(0.5)  # the call is resending against a socket that refuses
        daemon.start()
        t.join(timeout=60)
        assert not t.is_alive() and isinstance(box.get("r"), Committed), box
        assert s.submit(batch("rs-a")) == first


def test_after_the_horizon_a_daemon_gone_is_not_running(daemon):
    """A Stream that was connected and whose daemon does not come back gives up once its
    resend horizon passes: `NotRunning` if no connection could be made during the call."""
    s = Stream(daemon.stream_sock, timeout=30, resend_horizon=1.0)
    assert isinstance(s.submit(batch("gone-a")), Committed)
    daemon.kill()
    t0 = time.monotonic()
    with pytest.raises(NotRunning) as e:
        s.submit(batch("gone-b"))
    took = time.monotonic() - t0
    assert 0.9 <= took < 5, took
    assert e.value.errno == errno.ECONNREFUSED and e.value.results == [None], e.value
    daemon.start()


def test_defaults_ride_out_a_kill_9_and_restart(daemon):
    """iter_many on a kept connection, default settings: a kill -9 and a restart in the
    middle are ridden out (resent on a new connection until answered), every batch is
    yielded once, in order, committed once."""
    n = 1000
    batches = [batch(f"dr-{i}", f"d{i % 4}") for i in range(n)]
    got = []
    box = {}

    def client():
        try:
            with Stream(daemon.stream_sock, timeout=60) as s:
                for r in s.iter_many(batches, window=32):
                    got.append(r)
        except Exception as e:  # reported by the assertion below
            box["error"] = e

    t = threading.Thread(target=client, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while len(got) < 100:
        assert time.monotonic() < deadline, "the stream never got going"
        assert t.is_alive(), box
        time.sleep(0.01)
    daemon.kill()
    daemon.start()
    t.join(timeout=120)
    assert not t.is_alive(), "iter_many did not finish within 120 s"
    assert "error" not in box, box["error"]
    assert [r.request_key for r in got] == [b["request_key"] for b in batches]
    assert all(isinstance(r, Committed) for r in got), [r for r in got if not isinstance(r, Committed)][:3]
    assert len({i for r in got for i in r.ids}) == n
    assert sum(len(daemon.roost("scan", f"d{s}").stdout.splitlines()) for s in range(4)) == n


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
