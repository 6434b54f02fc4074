"""Not a test module: `mypy --strict` checks this file (daemon/tests/python_client.rs) to
show the types a caller sees: `Spool.submit` is a `Result` unless `wait=False` says it is
the spool name, a `str`; `Stream` is its own context manager."""

from roost_client import Committed, Result, Spool, Stream

spool = Spool("roost-data/spool")
batch = {"request_key": "order-17", "ops": [{"op": "create", "shard": "users", "record": {}}]}

result: Result = spool.submit(batch, timeout=30)
name: str = spool.submit(batch, wait=False)
name_too: str = spool.send(batch)
later: Result = spool.wait(name)
ids: list[int] = result.ids if isinstance(result, Committed) else []

with Stream("roost-data/stream.sock") as stream:
    one: Result = stream.submit(batch)
    many: list[Result] = stream.submit_many([batch, batch], window=2)
    for r in stream.iter_many([batch]):
        status: str = r.status
