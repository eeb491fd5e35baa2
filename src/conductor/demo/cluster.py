"""Start and stop the demo's processes: emulated engines and the gateway, each in its own
process group on 127.0.0.1, all stopped on exit whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    """Processes started so far; :meth:`stop` ends them all (SIGTERM, then SIGKILL)."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: Sequence[str], url: str) -> Proc:
        log = self.workdir / f"{name}.log"
        out = log.open("wb")
        popen = subprocess.Popen(
            [sys.executable, "-m", "conductor.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        proc = Proc(name, url, popen, log)
        self.procs.append(proc)
        return proc

    def wait_healthy(self, proc: Proc, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                tail = proc.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail}")
            try:
                if httpx.get(proc.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{proc.name} not healthy after {timeout_s:.0f}s (log: {proc.log})")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=5.0)
        self.procs.clear()
