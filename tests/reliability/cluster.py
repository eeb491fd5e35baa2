"""The processes the reliability suite attacks: ``conductor serve`` in front of emulated
engines (``conductor emulate``, vLLM's HTTP API and KV events), each its own process so that
it can be killed, stopped and restarted; and what the suite reads off them (RSS, fds)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.engines.costs import COMMITTED

MODEL = "tiny"
BLOCK = 16
MAX_MODEL_LEN = 2048
ADMIN_TOKEN = "reliability-admin-token"
COST_FILE = str(COMMITTED)
"""Gateway and engines share one cost model (the tiny model's committed profile), so the
scheduler's TBT predictions are the engines' real step times: capacity is what meets
TBT_SLO_MS."""
TBT_SLO_MS = 4.0
"""The profile's decode step is 2.34 ms + 0.021 ms per running request + 0.19 us per context
token (the predicted TBT of a lone request is about 3.6 ms)."""
GATEWAY_LIMITS = {
    # tight enough that the suite sees each limit act within seconds
    "head_timeout_s": "2.0",
    "body_timeout_s": "2.0",
    "keep_alive_s": "5.0",
    "max_connections": "256",
}


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            out.append(int(s.getsockname()[1]))
        return out


@dataclass
class Proc:
    name: str
    args: list[str]
    url: str
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def wait_ready(self, path: str = "/health", timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout_s} s")

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.popen is not None
        self.popen.wait(timeout=10)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def conductor(*args: str) -> list[str]:
    return [sys.executable, "-m", "conductor.cli.main", *args]


@dataclass
class Cluster:
    gateway: Proc
    engines: list[Proc]
    kv_ports: list[int]
    model_dir: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.gateway.url

    def engine_ids(self) -> list[str]:
        return [f"e{i}" for i in range(len(self.engines))]

    def restart_engine(self, i: int) -> None:
        self.engines[i].stop()
        self.engines[i].start()
        self.engines[i].wait_ready()


def make_model_dir(path: Path) -> Path:
    """The demo's tiny tokenizer (trained locally) as the served model's folder."""
    from conductor.demo.tokenizer import make_tokenizer

    if not (path / "tokenizer.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        make_tokenizer(path, model_max_length=MAX_MODEL_LEN)
    return path


def engine_proc(
    i: int, http: int, kv: int, replay: int, model_dir: Path, logs: Path, cache_blocks: int
) -> Proc:
    args = conductor(
        "emulate", "--port", str(http), "--kv-events-port", str(kv), "--replay-port",
        str(replay), "--model", MODEL, "--model-path", str(model_dir), "--block-size",
        str(BLOCK), "--max-model-len", str(MAX_MODEL_LEN), "--cost-file", COST_FILE,
        "--engine-id", f"e{i}", "--cache-blocks", str(cache_blocks),
    )  # fmt: skip
    return Proc(f"engine-{i}", args, f"http://127.0.0.1:{http}", logs / f"engine-{i}.log")


@contextlib.contextmanager
def cluster(
    logs: Path,
    model_dir: Path,
    n_engines: int = 2,
    extra: Sequence[str] = (),
    cache_blocks: int = 4096,
) -> Iterator[Cluster]:
    """``n_engines`` emulated engines (role both, KV events with replay) and ``conductor
    serve`` in front of them with the suite's tight limits; all stopped at the end."""
    engines, kv_ports, specs = [], [], []
    for i in range(n_engines):
        http, kv, replay = free_ports(3)
        engines.append(engine_proc(i, http, kv, replay, model_dir, logs, cache_blocks))
        kv_ports.append(kv)
        specs += [
            "--engine",
            f"http://127.0.0.1:{http},role=both,id=e{i},kv_events=tcp://127.0.0.1:{kv},"
            f"replay=tcp://127.0.0.1:{replay}",
        ]
    (port,) = free_ports(1)
    sets = [x for k, v in GATEWAY_LIMITS.items() for x in ("--set", f"{k}={v}")]
    args = conductor(
        "serve", *specs, "--model-path", str(model_dir), "--model-name", MODEL,
        "--block-size", str(BLOCK), "--max-model-len", str(MAX_MODEL_LEN), "--port", str(port),
        "--cost-file", COST_FILE, "--tbt-slo-ms", str(TBT_SLO_MS), "--admin-token", ADMIN_TOKEN,
        "--health-interval-s", "0.3",
        "--read-timeout-s", "2", "--request-timeout-s", "20", "--log-level", "warning",
        *sets, *extra,
    )  # fmt: skip
    gateway = Proc("gateway", args, f"http://127.0.0.1:{port}", logs / "gateway.log")
    c = Cluster(gateway, engines, kv_ports, model_dir)
    try:
        for e in engines:
            e.start()
        for e in engines:  # (so that no engine starts its life marked unhealthy)
            e.wait_ready()
        gateway.start()
        gateway.wait_ready("/ready")
        yield c
    finally:
        gateway.stop()
        for e in engines:
            e.stop()
