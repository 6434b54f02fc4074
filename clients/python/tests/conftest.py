"""A real `roost serve` for the tests: the binary from ROOST_BIN, else the workspace's
target/debug/roost; never skipped (a missing binary fails every test that needs it)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

START_LIMIT = 30.0  # seconds for a daemon to serve (recovery after a kill included)
STOP_LIMIT = 30.0


def roost_bin() -> str:
    env = os.environ.get("ROOST_BIN")
    if env:
        if not os.access(env, os.X_OK):
            pytest.fail(f"ROOST_BIN={env} is not an executable file", pytrace=False)
        return env
    default = HERE / ".." / ".." / "target" / "debug" / "roost"
    if not os.access(default, os.X_OK):
        pytest.fail(
            f"no roost binary: set ROOST_BIN, or build {default.resolve()} (cargo build -p roost)",
            pytrace=False,
        )
    return str(default)


class Daemon:
    """`roost --data-dir DIR serve`, its log in DIR/../serve.log."""

    def __init__(self, data: Path):
        self.bin = roost_bin()
        self.data = data
        self.log = data.parent / "serve.log"
        self.proc = None

    @property
    def spool(self) -> Path:
        return self.data / "spool"

    @property
    def stream_sock(self) -> Path:
        return self.data / "stream.sock"

    def start(self) -> "Daemon":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.bin, "--data-dir", str(self.data), "serve"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_LIMIT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"roost serve exited {self.proc.returncode}:\n{self.log_tail()}")
            # After a kill the old socket file is still there: only `status` answering
            # says this daemon is up.
            if self.stream_sock.exists() and self.status_ok():
                return self
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"roost serve not ready within {START_LIMIT} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def status_ok(self) -> bool:
        r = subprocess.run(
            [self.bin, "--data-dir", str(self.data), "status", "--json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
        )
        return r.returncode == 0

    def status(self) -> dict:
        """`roost status --json`, parsed."""
        r = self.roost("status", "--json")
        assert r.returncode == 0, f"roost status: {r.stderr}"
        return json.loads(r.stdout)

    def stop(self) -> int:
        """SIGTERM, and the exit code (bounded wait, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_LIMIT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"roost serve did not stop on SIGTERM within {STOP_LIMIT} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_LIMIT)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def roost(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.bin, "--data-dir", str(self.data), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "data").start()
    try:
        yield d
    finally:
        code = d.stop()
        assert code == 0, f"roost serve exited {code} on SIGTERM:\n{d.log_tail()}"
