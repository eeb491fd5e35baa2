"""Property-based fuzzing (hypothesis, derandomized): OpenAI bodies against the running
gateway never get a 5xx and every error is the JSON error shape; KV-event payloads from a
real ZMQ publisher never end the subscription and every message is counted (decoded or
undecodable), through the feed and through the gateway's metrics."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.core.events import KvEvent
from conductor.core.hashing import hash_block
from conductor.core.types import InstanceId
from conductor.gateway.engines.vllm_zmq import VllmEventSocket
from conductor.gateway.kv_feed import EngineKvIngest, KvFeed
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.wire import vllm_events_encode as enc
from tests.reliability.cluster import ADMIN_TOKEN, BLOCK, MODEL, Cluster, free_ports


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
anything = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
small_tokens = st.integers(min_value=-3, max_value=6) | st.sampled_from([10**12, 2**63, "7", 1.5])
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", ""]) | anything},
    optional={
        "content": st.text(max_size=40)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10)}
            ),
            max_size=2,
        )
        | anything,
        "name": anything,
    },
)
common = {
    "model": st.sampled_from([MODEL, MODEL, "other", ""]) | anything,
    "max_tokens": small_tokens,
}
optional = {
    "max_completion_tokens": small_tokens,
    "n": st.integers(min_value=-1, max_value=3) | st.sampled_from([10**9, 17]) | anything,
    "stream": st.booleans() | anything,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | anything,
    "temperature": st.floats(min_value=-1, max_value=3) | anything,
    "top_p": st.floats(min_value=-1, max_value=2) | anything,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | anything,
    "seed": st.integers(min_value=-5, max_value=2**64) | anything,
    "cache_salt": st.text(max_size=8) | anything,
    "chat_template_kwargs": st.dictionaries(
        st.sampled_from(["enable_thinking", "chat_template", "x"]), anything, max_size=2
    )
    | anything,
    "chat_template": st.text(max_size=20),
    "tools": st.lists(anything, max_size=2) | anything,
    "logprobs": anything,
    "add_special_tokens": anything,
}
completion_body = st.fixed_dictionaries(
    {
        **common,
        "prompt": st.text(max_size=120)
        | st.lists(st.integers(min_value=-2, max_value=1200), max_size=20)
        | anything,
    },
    optional=optional,
)
chat_body = st.fixed_dictionaries(
    {**common, "messages": st.lists(message, max_size=3) | anything},
    optional={**optional, "add_generation_prompt": anything, "continue_final_message": anything},
)


def check_answer(resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["code"] == resp.status_code


@pytest.fixture(scope="module")
def client(gateway_cluster: Cluster) -> Any:
    with httpx.Client(base_url=gateway_cluster.url, timeout=30) as c:
        yield c


@fuzz(60)
@given(body=completion_body)
def test_fuzzed_completion_bodies_never_get_a_5xx(
    client: httpx.Client, body: dict[str, Any]
) -> None:
    check_answer(client.post("/v1/completions", json=body))


@fuzz(60)
@given(body=chat_body)
def test_fuzzed_chat_bodies_never_get_a_5xx(client: httpx.Client, body: dict[str, Any]) -> None:
    check_answer(client.post("/v1/chat/completions", json=body))


@fuzz(40)
@given(raw=st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_fuzzed_raw_bodies_never_get_a_5xx(client: httpx.Client, raw: bytes) -> None:
    check_answer(client.post("/v1/completions", content=raw))


def valid_payload(seq: int) -> bytes:
    tokens = list(range(seq * BLOCK, (seq + 1) * BLOCK))
    stored = enc.block_stored([10_000 + seq], tokens, BLOCK)
    return enc.encode_payload([stored], ts=float(seq))


packable = st.recursive(  # msgpack's integers are 64-bit
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
kv_payload = (
    st.binary(max_size=120)
    | packable.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | st.builds(
        lambda ts, events, rank: msgpack.packb([ts, events, rank], use_bin_type=True),
        packable,
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(
                        ["BlockStored", "BlockRemoved", "AllBlocksCleared", "X"]
                    ),
                },
                optional={
                    "block_hashes": st.lists(packable, max_size=3) | packable,
                    "parent_block_hash": packable,
                    "token_ids": st.lists(
                        st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=40
                    )
                    | packable,
                    "block_size": st.integers(min_value=-2, max_value=20) | packable,
                    "medium": packable,
                    "extra_keys": packable,
                    "group_idx": packable,
                },
            ),
            max_size=3,
        ),
        packable,
    )
)
frames = st.lists(st.binary(max_size=10), min_size=0, max_size=4) | st.tuples(
    st.just(b"kv"), st.binary(min_size=8, max_size=8), kv_payload
).map(list)


async def deliver(messages: list[list[bytes]]) -> tuple[int, int]:
    """Publishes ``messages`` to a real VllmEventSocket feed, after probes (until one got
    through: ZMQ's slow joiner) and before a sentinel; returns (messages sent, messages the
    feed counted, decoded or undecodable)."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    (port,) = free_ports(1)
    pub.bind(f"tcp://127.0.0.1:{port}")
    queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=100_000)
    ingest = EngineKvIngest(EngineHashMapper(InstanceId("fuzz"), hash_block, max_blocks=1000))
    source = VllmEventSocket(endpoint=f"tcp://127.0.0.1:{port}", topic=b"", context=ctx)
    feed = KvFeed(source, ingest, queue, catch_up_on_join=False)
    task = asyncio.create_task(feed.run())
    probes = 0
    try:
        await feed.wait_connected()
        async with asyncio.timeout(10):
            while feed.stats.batches == 0:
                await pub.send_multipart(enc.pub_frames(b"kv", probes, valid_payload(probes)))
                probes += 1
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # probes still on their way arrive (or were never routed)
        before = feed.stats.batches + feed.stats.decode_errors
        for m in messages:
            await pub.send_multipart(m)
        await pub.send_multipart(enc.pub_frames(b"kv", 10**6, valid_payload(10**6)))
        sent = len(messages) + 1
        async with asyncio.timeout(10):
            while feed.stats.batches + feed.stats.decode_errors < before + sent:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not task.done()  # the subscription survived everything
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close(linger=0)
        ctx.term()
    return sent, feed.stats.batches + feed.stats.decode_errors - before


@fuzz(25)
@given(messages=st.lists(frames, min_size=1, max_size=25))
def test_fuzzed_kv_payloads_are_all_counted(messages: list[list[bytes]]) -> None:
    messages = [m for m in messages if m]  # (ZMQ sends no empty multipart message)
    sent, counted = asyncio.run(deliver(messages))
    assert counted == sent


def test_the_gateway_counts_undecodable_kv_messages(gateway_cluster: Cluster) -> None:
    """A publisher the gateway subscribes to (an engine added over the admin API, drained
    so that no request goes to it) sends garbage: every message shows in /metrics."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    (port,) = free_ports(1)
    pub.bind(f"tcp://127.0.0.1:{port}")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = gateway_cluster.engines[0].url
    with httpx.Client(base_url=gateway_cluster.url, headers=headers, timeout=10) as c:
        spec = {"id": "fuzz", "url": base, "role": "both", "kv_events": f"tcp://127.0.0.1:{port}"}
        assert c.post("/admin/engines", json=spec).status_code == 201
        assert c.post("/admin/engines/fuzz/drain").status_code == 200

        def count(reason: str) -> float:
            for line in c.get("/metrics").text.splitlines():
                if line.startswith(
                    f'conductor_kv_dropped_total{{engine="fuzz",reason="{reason}"}}'
                ):
                    return float(line.split()[-1])
            return -1.0

        try:
            deadline = time.monotonic() + 10
            probes = 0
            while count("undecodable") < 1 and time.monotonic() < deadline:
                pub.send_multipart([b"probe"])  # one frame: undecodable
                probes += 1
                time.sleep(0.05)
            seen = count("undecodable")
            assert seen >= 1
            for i in range(200):
                pub.send_multipart([b"kv", b"\x00" * 8, b"\xc1" * (i + 1)])  # 0xc1: never msgpack
            deadline = time.monotonic() + 10
            while count("undecodable") < seen + 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert count("undecodable") == seen + 200
            assert c.get("/health").status_code == 200
        finally:
            assert c.delete("/admin/engines/fuzz").status_code == 200
            pub.close(linger=0)
            ctx.term()
    assert json.loads(httpx.get(gateway_cluster.url + "/ready").text)["status"] == "ready"
