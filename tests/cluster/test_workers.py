"""`conductor serve --workers 2`: two processes on one port (SO_REUSEPORT) that sync over a
nats-server the command starts itself, and all of it stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from conductor.demo.cluster import Cluster, free_ports
from conductor.demo.tokenizer import make_tokenizer

pytestmark = pytest.mark.slow


def children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_two_workers_share_a_port_and_sync(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    make_tokenizer(tok)
    cluster = Cluster(tmp_path)
    http, kv, port = free_ports(3)
    try:
        engine = cluster.start(
            "engine",
            ["emulate", "--port", str(http), "--role", "both", "--kv-events-port", str(kv),
             "--model-path", str(tok), "--model", "demo", "--engine-id", "e0"],
            f"http://127.0.0.1:{http}",
        )  # fmt: skip
        cluster.wait_healthy(engine)
        gw = cluster.start(
            "gateway",
            ["serve", "--engine", f"{engine.url},role=both,kv_events=tcp://127.0.0.1:{kv},"
             "id=e0,model=demo,block_size=32", "--model-path", str(tok), "--model-name", "demo",
             "--block-size", "32", "--max-model-len", "8192", "--port", str(port),
             "--workers", "2", "--replica-id", "host"],
            f"http://127.0.0.1:{port}",
        )  # fmt: skip
        cluster.wait_healthy(gw)
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            len(seen) < 2 or any(v != 1.0 for v in seen.values())
        ):
            # a new connection each time: the kernel picks the worker
            text = httpx.get(gw.url + "/metrics", timeout=5).text
            m = re.search(r'^conductor_cluster_peers\{replica="([^"]+)"\} (\S+)$', text, re.M)
            assert m is not None
            seen[m.group(1)] = float(m.group(2))
            time.sleep(0.05)
        assert seen == {"host-w0": 1.0, "host-w1": 1.0}
        body = {"model": "demo", "prompt": "hello there", "max_tokens": 4}
        for _ in range(6):
            r = httpx.post(gw.url + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200
        procs = children(gw.popen.pid)
        assert len(procs) >= 3  # two workers, the nats-server (and multiprocessing's tracker)
        os.killpg(gw.popen.pid, signal.SIGTERM)
        assert gw.popen.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in procs):
            time.sleep(0.1)
        assert not [p for p in procs if alive(p)]
    finally:
        cluster.stop()
