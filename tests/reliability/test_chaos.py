"""Chaos with bounded load: an engine killed with SIGKILL and restarted, an engine stopped
(SIGSTOP) past the read timeout, a KV-event stream cut and resumed. Every accepted request
completes or ends with a clear error within its deadline, none hangs; traffic and the index
come back."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.cluster import ADMIN_TOKEN, MODEL, Cluster
from tests.reliability.forwarder import Forwarder
from tests.reliability.load import run_load

CLEAR = {"ok", "stream_error", "http_502", "http_503", "http_504"}
"""What a request may end as under chaos (never a hang, a truncated stream, a reset)."""


@pytest.fixture
def admin(gateway_cluster: Cluster) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=gateway_cluster.url, headers=headers, timeout=30) as c:
        yield c


def engines(admin: httpx.Client) -> dict[str, dict[str, object]]:
    return {e["id"]: e for e in admin.get("/admin/engines").json()["engines"]}


def wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def e0_failures(admin: httpx.Client) -> float:
    """Times e0 was marked unhealthy (any reason) so far."""
    return sum(
        float(line.split()[-1])
        for line in admin.get("/metrics").text.splitlines()
        if line.startswith('conductor_engine_failures_total{engine="e0"')
    )


def complete(admin: httpx.Client, prompt: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return admin.post("/v1/completions", json=body)


def only_on(admin: httpx.Client, engine_id: str, all_ids: list[str]) -> None:
    for other in all_ids:
        action = "resume" if other == engine_id else "drain"
        assert admin.post(f"/admin/engines/{other}/{action}").status_code == 200


def resume_all(admin: httpx.Client, ids: list[str]) -> None:
    for i in ids:
        assert admin.post(f"/admin/engines/{i}/resume").status_code == 200


def test_kill9_and_restart_loses_no_request_to_a_hang(
    gateway_cluster: Cluster, admin: httpx.Client
) -> None:
    c = gateway_cluster
    outcomes = asyncio.run(
        run_load(c.url, seconds=4.0, concurrency=6, events=[(1.0, c.engines[1].kill9)])
    )
    assert set(outcomes) <= CLEAR, outcomes
    assert outcomes["ok"] >= 10, outcomes
    wait_for(lambda: not engines(admin)["e1"]["healthy"])
    c.engines[1].start()  # same ports: the gateway finds it again
    c.engines[1].wait_ready()
    wait_for(lambda: engines(admin)["e1"]["healthy"])
    only_on(admin, "e1", c.engine_ids())
    try:
        attempts = iter(range(1000))

        def served_and_indexed() -> bool:
            # A new prompt each try: a batch published while the subscriber rejoins the
            # restarted engine is missed, and a repeated prompt would store nothing new.
            resp = complete(admin, f"after the restart, the first words, try {next(attempts)} " * 4)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-conductor-prefill"] == "e1"
            time.sleep(0.2)
            return engines(admin)["e1"]["indexed_blocks"] > 0  # type: ignore[operator,no-any-return]

        wait_for(served_and_indexed)
    finally:
        resume_all(admin, c.engine_ids())


def test_sigstop_past_the_read_timeout_fails_requests_not_the_engine(
    gateway_cluster: Cluster, admin: httpx.Client
) -> None:
    c = gateway_cluster
    stopped = c.engines[0]
    failures_before = e0_failures(admin)
    outcomes = asyncio.run(
        run_load(
            c.url,
            seconds=5.0,
            concurrency=6,
            events=[
                (1.0, lambda: stopped.signal(signal.SIGSTOP)),
                (4.0, lambda: stopped.signal(signal.SIGCONT)),  # stopped 3 s > read timeout 2 s
            ],
        )
    )
    assert set(outcomes) <= CLEAR, outcomes
    assert outcomes["ok"] >= 10, outcomes
    assert e0_failures(admin) == failures_before  # slow is not dead
    assert engines(admin)["e0"]["healthy"]
    only_on(admin, "e0", c.engine_ids())
    try:
        resp = complete(admin, "after the pause, e0 serves again")
        assert (resp.status_code, resp.headers["x-conductor-prefill"]) == (200, "e0")
    finally:
        resume_all(admin, c.engine_ids())


def test_kv_stream_cut_and_resumed_is_replayed(
    gateway_cluster: Cluster, admin: httpx.Client
) -> None:
    """A second view of engine e1 ("e1b") whose KV events pass through a forwarder that is
    cut while e1 stores a prompt's blocks: after the resume, the missed batches are replayed
    (no resync) and the index knows that prompt."""
    c = gateway_cluster
    e1 = engines(admin)["e1"]
    kv_port = int(str(e1["kv_events"]).rsplit(":", 1)[1])
    fwd = Forwarder(("127.0.0.1", kv_port))
    spec = {
        "id": "e1b",
        "url": e1["url"],
        "role": "both",
        "kv_events": f"tcp://127.0.0.1:{fwd.port}",
        "replay": e1["replay"],
    }
    assert admin.post("/admin/engines", json=spec).status_code == 201
    ids = [*c.engine_ids(), "e1b"]
    try:
        only_on(admin, "e1b", ids)
        wait_for(lambda: fwd.accepted >= 1)  # the gateway subscribed through the forwarder

        attempts = iter(range(1000))

        def warm() -> bool:  # (batches published while the subscription joins are missed)
            # A new prompt each try: a repeated one hits the engine's cache and stores nothing.
            words = f"warm words before the cut, try {next(attempts)} " * 4
            assert complete(admin, words).status_code == 200
            time.sleep(0.2)
            return engines(admin)["e1b"]["indexed_blocks"] > 0  # type: ignore[operator,no-any-return]

        wait_for(warm)
        fwd.cut()
        prompt = "these words are stored while the stream is cut " * 4
        assert complete(admin, prompt).status_code == 200
        time.sleep(0.5)
        before = engines(admin)["e1b"]["indexed_blocks"]
        fwd.resume()
        wait_for(lambda: fwd.accepted >= 2)  # the gateway's subscriber reconnected
        time.sleep(0.3)
        assert complete(admin, "a later request reveals the gap").status_code == 200
        wait_for(lambda: engines(admin)["e1b"]["indexed_blocks"] > before)  # type: ignore[operator]
        again = complete(admin, prompt)
        assert again.headers["x-conductor-prefill"] == "e1b"
        assert int(again.headers["x-conductor-cached-tokens"]) > 0  # replayed, not lost
        metrics = admin.get("/metrics").text
        assert 'conductor_kv_resyncs_total{engine="e1b"' not in metrics
    finally:
        admin.delete("/admin/engines/e1b")
        resume_all(admin, c.engine_ids())
        fwd.close()
