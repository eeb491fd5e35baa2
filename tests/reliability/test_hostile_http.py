"""Hostile HTTP against ``conductor serve``: each case gets its exact 4xx JSON answer, the
connection is kept or closed as specified, the gateway stays alive and answers /health
promptly, and its RSS and fds come back to their baseline."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.reliability.cluster import ADMIN_TOKEN, MODEL, Cluster
from tests.reliability.rawhttp import address, read_answer, send

RSS_GROWTH_BOUND = 64 * 1024 * 1024
"""What the whole hostile run may add to the gateway's RSS (allocator slack included)."""


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%b"
        b"Content-Length: %d\r\n\r\n%b" % (path.encode(), extra, len(body), body)
    )


def get(path: str, headers: bytes = b"Host: gw\r\n", version: bytes = b"1.1") -> bytes:
    return b"GET %b HTTP/%b\r\n%b\r\n" % (path.encode(), version, headers)


def error(status: int, message: str, type_: str, param: str | None = None) -> object:
    err: dict[str, object] = {"message": message, "type": type_}
    if param is not None:
        err["param"] = param
    err["code"] = status
    return {"error": err}


def bad(message: str, param: str | None = None) -> object:
    return error(400, message, "invalid_request_error", param)


COMPLETION = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CASES: list[tuple[str, bytes, int, object, bool]] = [
    # (name, raw request, status, JSON body, connection closed)
    (
        "120k-duplicate-headers",
        b"GET /health HTTP/1.1\r\nHost: gw\r\n" + b"X-Dup: 0123456789\r\n" * 120_000 + b"\r\n",
        431,
        error(431, "request has more than 100 headers (max_headers)", "error"),
        True,
    ),
    (
        "40k-headers",
        b"GET /health HTTP/1.1\r\nHost: gw\r\n"
        + b"".join(b"X-%d: v\r\n" % i for i in range(40_000))
        + b"\r\n",
        431,
        error(431, "request has more than 100 headers (max_headers)", "error"),
        True,
    ),
    (
        "4MB-header",
        b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n",
        431,
        error(431, "request head exceeds 61440 bytes (max_header_bytes)", "error"),
        True,
    ),
    ("no-host", get("/health", b""), 400, bad("missing Host header"), True),
    (
        "two-hosts",
        get("/health", b"Host: a\r\nHost: b\r\n"),
        400,
        bad("more than one Host header"),
        True,
    ),
    (
        "http10-chunked",
        b"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
        bad("Transfer-Encoding is not allowed in an HTTP/1.0 request"),
        True,
    ),
    (
        "trace",
        b"TRACE / HTTP/1.1\r\nHost: gw\r\n\r\n",
        405,
        error(405, "method TRACE is not allowed", "invalid_request_error"),
        True,
    ),
    (
        "connect",
        b"CONNECT gw:443 HTTP/1.1\r\nHost: gw:443\r\n\r\n",
        405,
        error(405, "method CONNECT is not allowed", "invalid_request_error"),
        True,
    ),
    (
        "malformed",
        b"GET /health HTTP/1.1\r\nHost gw\r\n\r\n",
        400,
        None,  # the parser's own words
        True,
    ),
    (
        "body-over-limit",
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5242880\r\n"
        b"Expect: 100-continue\r\n\r\n",
        413,
        error(
            413,
            "request body of 5242880 bytes exceeds the limit of 4194304",
            "invalid_request_error",
        ),
        True,
    ),
    (
        "100k-deep-json",
        post("/v1/completions", b"[" * 100_000 + b"]" * 100_000),
        400,
        bad("request body nests deeper than 64 levels (max_json_depth)"),
        False,
    ),
    (
        "n-1e9",
        post("/v1/completions", json.dumps({**COMPLETION, "n": 10**9}).encode()),
        400,
        bad("'n' must be <= 16, got 1000000000", "n"),
        False,
    ),
    (
        "client-template",
        post(
            "/v1/chat/completions",
            json.dumps(
                {
                    **CHAT,
                    "chat_template_kwargs": {
                        "chat_template": "{% for i in range(64000000) %}{% endfor %}"
                    },
                }
            ).encode(),
        ),
        400,
        bad(
            "'chat_template_kwargs.chat_template' is not accepted; allowed: enable_thinking, "
            "thinking, reasoning_effort",
            "chat_template_kwargs.chat_template",
        ),
        False,
    ),
    (
        "admin-port-not-a-number",
        post(
            "/admin/engines",
            json.dumps(
                {"url": "http://127.0.0.1:1", "role": "both", "kv_events": "tcp://h:port"}
            ).encode(),
            b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n",
        ),
        400,
        bad(
            "invalid engine.kv_events='tcp://h:port': must look like tcp://host:port or ipc://path",
            "engine.kv_events",
        ),
        False,
    ),
]


@pytest.fixture(scope="module")
def baseline(gateway_cluster: Cluster) -> tuple[int, int]:
    with httpx.Client(base_url=gateway_cluster.url, timeout=30) as client:
        for _ in range(3):  # warm the paths the cases take
            assert client.post("/v1/completions", json=COMPLETION).status_code == 200
    time.sleep(0.5)
    return gateway_cluster.gateway.rss_bytes(), gateway_cluster.gateway.fds()


@pytest.mark.parametrize(
    ("raw", "status", "body", "closed"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_hostile_request_gets_its_exact_answer(
    gateway_cluster: Cluster,
    baseline: tuple[int, int],
    raw: bytes,
    status: int,
    body: object,
    closed: bool,
) -> None:
    answer = send(gateway_cluster.url, raw)
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    if body is None:
        assert answer.json()["error"]["message"].startswith("malformed HTTP request")  # type: ignore[index]
    else:
        assert answer.json() == body
    assert answer.closed is closed
    health = httpx.get(gateway_cluster.url + "/health", timeout=5)
    assert (health.status_code, health.json()) == (200, {"status": "alive"})


def test_upgrade_request_is_served_with_its_body(gateway_cluster: Cluster) -> None:
    body = json.dumps(COMPLETION).encode()
    answer = send(
        gateway_cluster.url,
        post(
            "/v1/completions",
            body,
            b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n",
        ),
    )
    assert answer.status == 200
    assert answer.json()["object"] == "text_completion"  # type: ignore[index]
    assert answer.closed


def slowloris(url: str, n: int, seconds: float, alive: list[bool]) -> None:
    """``n`` connections sending one header byte every 0.25 s for ``seconds``; ``alive[i]``
    ends True only if connection ``i`` was never cut."""
    socks = [socket.create_connection(address(url)) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
    alive[:] = [True] * n
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if alive[i]:
                try:
                    s.sendall(b"a")
                except OSError:
                    alive[i] = False
        time.sleep(0.25)
    for i, s in enumerate(socks):
        if alive[i]:
            s.settimeout(0.5)
            try:
                data = s.recv(4096)
                alive[i] = not data.startswith(b"HTTP/1.1 408")
            except (TimeoutError, OSError):
                pass
        s.close()


def test_slowloris_connections_are_cut_and_health_stays_prompt(gateway_cluster: Cluster) -> None:
    alive: list[bool] = []
    attack = threading.Thread(target=slowloris, args=(gateway_cluster.url, 50, 4.0, alive))
    attack.start()
    latencies = []
    with httpx.Client(base_url=gateway_cluster.url, timeout=5) as client:
        while attack.is_alive():
            t0 = time.monotonic()
            assert client.get("/health").status_code == 200
            latencies.append(time.monotonic() - t0)
            time.sleep(0.1)
    attack.join()
    assert alive == [False] * 50  # each cut by the 2 s head deadline (408)
    assert max(latencies) < 1.0  # a liveness bound, not a benchmark
    metrics = httpx.get(gateway_cluster.url + "/metrics").text
    assert 'conductor_http_refused_total{reason="head_timeouts"}' in metrics


def test_connections_beyond_the_cap_get_503_then_recover(gateway_cluster: Cluster) -> None:
    held = [socket.create_connection(address(gateway_cluster.url)) for _ in range(256)]
    try:
        with socket.create_connection(address(gateway_cluster.url)) as extra:
            extra.sendall(get("/health"))
            answer = read_answer(extra)
    finally:
        for s in held:
            s.close()
    assert answer.status == 503
    assert answer.json() == error(503, "too many connections (limit 256); retry later", "error")
    assert answer.headers["retry-after"] == "1"
    time.sleep(0.2)
    assert httpx.get(gateway_cluster.url + "/health", timeout=5).status_code == 200


def test_rss_and_fds_come_back_to_baseline(
    gateway_cluster: Cluster, baseline: tuple[int, int]
) -> None:
    rss0, fds0 = baseline
    deadline = time.monotonic() + 10
    while gateway_cluster.gateway.fds() > fds0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gateway_cluster.gateway.fds() <= fds0
    assert gateway_cluster.gateway.rss_bytes() - rss0 < RSS_GROWTH_BOUND
