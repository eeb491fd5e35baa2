"""vLLM engines: the first :class:`~conductor.gateway.engines.kind.EngineKind`.

- KV events: vLLM's ZMQ publisher (``--kv-events-config``), read by
  :class:`~conductor.gateway.engines.vllm_zmq.VllmEventSocket`, with replay.
- Health: ``GET /health`` answers 200.
- Load: the engine's Prometheus text at ``/metrics``; only three gauges are read, by a line
  scan (a vLLM page holds hundreds of histogram lines; parsing them all with
  ``prometheus_client.parser`` cost more CPU than a hundred requests).
- Prefill/decode legs (vLLM's toy disaggregated proxy): the prefill leg asks for one token,
  not streamed; with NIXL/Mooncake-style connectors it carries
  :data:`KV_TRANSFER_PARAMS_PREFILL` and its answer's ``kv_transfer_params`` go to the decode
  leg, which is the client's request as is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

import httpx
import zmq.asyncio

from conductor.core.events import KvEvent
from conductor.gateway.engines.kind import ReportedLoad
from conductor.gateway.engines.vllm_zmq import VllmEventSocket
from conductor.gateway.kv_feed import EngineKvIngest, KvFeed

if TYPE_CHECKING:
    from conductor.gateway.config import EngineConfig

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
"""vLLM names it ``_perc`` but reports 0..1."""

KV_TRANSFER_PARAMS_PREFILL: Mapping[str, object] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefill leg carries for NIXL/Mooncake-style connectors (vLLM toy proxy)."""

_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:#")


def parse_vllm_metrics(text: str) -> ReportedLoad:
    """The load gauges of a vLLM ``/metrics`` page, summed over label sets (KV usage
    averaged); missing gauges count as 0. Raises ``ValueError`` when the text is not
    Prometheus exposition format (a line that starts like no sample or comment, or a gauge
    sample without a number)."""
    sums = {RUNNING: 0.0, WAITING: 0.0, KV_USAGE: 0.0}
    counts = dict.fromkeys(sums, 0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] not in _FIRST:
            raise ValueError(f"not Prometheus text: {line[:80]!r}")
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rindex("}") + 1 :]
        else:
            name, rest = line[:space], line[space:]
        if name in sums:
            fields = rest.split()
            if not fields:
                raise ValueError(f"sample without a value: {line[:80]!r}")
            sums[name] += float(fields[0])
            counts[name] += 1
    usage = sums[KV_USAGE] / counts[KV_USAGE] if counts[KV_USAGE] else 0.0
    return ReportedLoad(round(sums[RUNNING]), round(sums[WAITING]), usage)


def vllm_kv_feed(
    *,
    endpoint: str,
    ingest: EngineKvIngest,
    queue: asyncio.Queue[KvEvent],
    topic: bytes = b"",
    replay_endpoint: str | None = None,
    replay_timeout_s: float = 2.0,
    context: zmq.asyncio.Context | None = None,
) -> KvFeed:
    """A feed from a vLLM publisher at ``endpoint`` (replaying from ``replay_endpoint``)."""
    source = VllmEventSocket(
        endpoint=endpoint,
        topic=topic,
        replay_endpoint=replay_endpoint,
        replay_timeout_s=replay_timeout_s,
        context=context,
    )
    return KvFeed(source, ingest, queue)


def prefill_body(
    body: Mapping[str, object], model: str, *, transfer_params: bool
) -> dict[str, object]:
    """The prefill leg of the disaggregated flow: one token, not streamed."""
    out = dict(body)
    out["model"] = model
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    for key in ("stream_options", "min_tokens", "n", "best_of"):
        out.pop(key, None)
    if transfer_params:
        out["kv_transfer_params"] = dict(KV_TRANSFER_PARAMS_PREFILL)
    return out


def kv_params_of(content: bytes) -> dict[str, object] | None:
    """``kv_transfer_params`` of a prefill answer, if it has any."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    params = data.get("kv_transfer_params") if isinstance(data, dict) else None
    return params if isinstance(params, dict) else None


class VllmKind:
    """vLLM's OpenAI server (see the module docstring); stateless."""

    name = "vllm"

    def kv_feed(
        self,
        config: EngineConfig,
        ingest: EngineKvIngest,
        queue: asyncio.Queue[KvEvent],
        context: zmq.asyncio.Context,
    ) -> KvFeed | None:
        if config.kv_events is None:
            return None
        return vllm_kv_feed(
            endpoint=config.kv_events,
            ingest=ingest,
            queue=queue,
            topic=config.topic.encode(),
            replay_endpoint=config.replay,
            context=context,
        )

    async def probe_health(
        self, client: httpx.AsyncClient, base_url: str, timeout_s: float
    ) -> str | None:
        try:
            resp = await client.get(f"{base_url}/health", timeout=timeout_s)
        except httpx.TimeoutException:
            return "timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if resp.status_code != 200:
            return f"status {resp.status_code}"
        return None

    async def read_load(
        self, client: httpx.AsyncClient, base_url: str, timeout_s: float
    ) -> ReportedLoad:
        resp = await client.get(f"{base_url}/metrics", timeout=timeout_s)
        resp.raise_for_status()
        return parse_vllm_metrics(resp.text)

    def prefill_body(
        self, body: Mapping[str, object], model: str, *, transfer_params: bool
    ) -> dict[str, object]:
        return prefill_body(body, model, transfer_params=transfer_params)

    def decode_body(
        self,
        body: Mapping[str, object],
        model: str,
        prefill_answer: bytes,
        *,
        transfer_params: bool,
    ) -> dict[str, object]:
        out = dict(body)
        out["model"] = model
        kv = kv_params_of(prefill_answer) if transfer_params else None
        if kv is not None:
            out["kv_transfer_params"] = dict(kv)
        return out
