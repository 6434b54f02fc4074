"""Not a test module: the client side of daemon/tests/python_failover.rs.

Two clients with this package's default settings, each on its own node's stream socket:
`one` sends one batch at a time on a kept connection (`with Stream(...)`, `submit`), timing
each call; `many` runs `iter_many` over 50 batches at a time (window 16), timing the gap
between two answers. Both go on until a line `stop` on stdin (or its end), printing
`progress ONE MANY` every 10 answers. At the end one JSON line: every answer (key, status,
ids), the errors raised (none expected) and the longest wait each client saw.

    python3 failover_client.py ONE_SOCKET MANY_SOCKET
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Callable, Dict, List

from roost_client import Committed, Result, Stream

Answer = Dict[str, Any]


def batch(key: str) -> Dict[str, Any]:
    ops = [{"op": "create", "shard": "py", "record": {"k": key, "i": i}} for i in range(2)]
    return {"request_key": key, "ops": ops}


def answer(r: Result, waited: float) -> Answer:
    ids = r.ids if isinstance(r, Committed) else []
    return {"key": r.request_key, "status": r.status, "ids": ids, "waited": waited}


class Clients:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers: Dict[str, List[Answer]] = {"one": [], "many": []}
        self.errors: List[str] = []
        self.printed = 0

    def record(self, who: str, a: Answer) -> None:
        with self.lock:
            self.answers[who].append(a)
            total = len(self.answers["one"]) + len(self.answers["many"])
            if total // 10 > self.printed // 10:
                print(f"progress {len(self.answers['one'])} {len(self.answers['many'])}", flush=True)
            self.printed = total

    def one(self, socket_path: str) -> None:
        with Stream(socket_path) as s:
            i = 0
            while not self.stop.is_set():
                t0 = time.monotonic()
                r = s.submit(batch(f"one-{i}"))
                self.record("one", answer(r, time.monotonic() - t0))
                i += 1

    def many(self, socket_path: str) -> None:
        s = Stream(socket_path)
        chunk = 0
        while not self.stop.is_set():
            batches = [batch(f"many-{chunk}-{j}") for j in range(50)]
            last = time.monotonic()
            for r in s.iter_many(batches, window=16):
                now = time.monotonic()
                self.record("many", answer(r, now - last))
                last = now
            chunk += 1

    def run(self, name: str, client: Callable[[str], None], socket_path: str) -> threading.Thread:
        def body() -> None:
            try:
                client(socket_path)
            except Exception as e:  # reported in the summary; the test fails on any
                with self.lock:
                    self.errors.append(f"{name}: {type(e).__name__}: {e}")

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        return t


def main() -> int:
    one_socket, many_socket = sys.argv[1], sys.argv[2]
    c = Clients()
    threads = [c.run("one", c.one, one_socket), c.run("many", c.many, many_socket)]
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    c.stop.set()
    for t in threads:
        t.join(timeout=120)
    alive = [t.name for t in threads if t.is_alive()]
    with c.lock:
        summary = {
            "answers": c.answers,
            "errors": c.errors + [f"{n}: still running 120 s after stop" for n in alive],
            "longest": {k: max((a["waited"] for a in v), default=0.0) for k, v in c.answers.items()},
        }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
